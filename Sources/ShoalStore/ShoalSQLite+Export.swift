// The store's SQLite wrapper lives in ShoalSQLite, which the relay's embedded storage shares; whoever imports
// ShoalStore keeps `SQLiteConnection` and `SQLiteStatement` as before.
@_exported import ShoalSQLite
