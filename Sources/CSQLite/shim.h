#ifndef SHOAL_CSQLITE_SHIM_H
#define SHOAL_CSQLITE_SHIM_H
// Debian's libsqlite3 is built with the pre-update hook; its declarations are only visible with this define.
#define SQLITE_ENABLE_PREUPDATE_HOOK 1
#include <sqlite3.h>

// sqlite3_db_config is variadic, which Swift does not import: the integer-flag form.
static inline int shoal_db_config_flag(sqlite3 *db, int op, int value) {
    return sqlite3_db_config(db, op, value, (int *)0);
}
#endif
