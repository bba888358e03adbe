#ifndef SHOAL_CSQLITE_SHIM_H
#define SHOAL_CSQLITE_SHIM_H
// Debian's libsqlite3 is built with the pre-update hook; its declarations are only visible with this define.
#define SQLITE_ENABLE_PREUPDATE_HOOK 1
#include <sqlite3.h>

// In the pre-update hook of an INSERT or UPDATE: the first of `positions` whose new value is a TEXT or BLOB
// longer than `maximum` bytes, or -1. In C because it runs for every row written (sqlite3_value_bytes is O(1)).
static inline int shoal_preupdate_oversized(sqlite3 *db, const int *positions, int count, sqlite3_int64 maximum) {
    for (int index = 0; index < count; index++) {
        sqlite3_value *value = 0;
        if (sqlite3_preupdate_new(db, positions[index], &value) != SQLITE_OK || value == 0) continue;
        int type = sqlite3_value_type(value);
        if ((type == SQLITE_TEXT || type == SQLITE_BLOB) && sqlite3_value_bytes(value) > maximum) {
            return positions[index];
        }
    }
    return -1;
}

// sqlite3_db_config is variadic, which Swift does not import: the integer-flag form.
static inline int shoal_db_config_flag(sqlite3 *db, int op, int value) {
    return sqlite3_db_config(db, op, value, (int *)0);
}
#endif
