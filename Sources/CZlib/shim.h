#ifndef SHOAL_CZLIB_SHIM_H
#define SHOAL_CZLIB_SHIM_H
#include <zlib.h>

// deflateInit and inflateInit are macros (they pass the header's version and the stream's size), which Swift does
// not import: the same calls as functions.
static inline int shoal_deflate_init(z_stream *stream, int level) {
    return deflateInit(stream, level);
}

static inline int shoal_inflate_init(z_stream *stream) {
    return inflateInit(stream);
}
#endif
