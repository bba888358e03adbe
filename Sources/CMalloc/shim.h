#ifndef SHOAL_CMALLOC_SHIM_H
#define SHOAL_CMALLOC_SHIM_H
// glibc's malloc tuning (mallopt), which its Swift module leaves out.
#include <malloc.h>
#endif
