/* Compiled only when the installed meshrt has the C API (include/meshrt/meshrt.h): proves the
 * header is plain C99 for an engine written in C. */
#include <meshrt/meshrt.h>
#include <meshrt/version.h>

const char* consumer_c_version(void) { return MESHRT_VERSION_STRING; }
