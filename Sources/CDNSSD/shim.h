#ifndef SHOAL_CDNSSD_SHIM_H
#define SHOAL_CDNSSD_SHIM_H
// Avahi's Bonjour-compatible API (Debian: libavahi-compat-libdnssd-dev).
#include <dns_sd.h>
#endif
