#ifndef SHOAL_CSQLITE_SHIM_H
#define SHOAL_CSQLITE_SHIM_H
// Debian's libsqlite3 is built with the pre-update hook; its declarations are only visible with this define.
#define SQLITE_ENABLE_PREUPDATE_HOOK 1
#include <sqlite3.h>
#endif
