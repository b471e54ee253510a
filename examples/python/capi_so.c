/* meshrt_capi_test_so: the C API (linked whole from meshrt_capi) as a shared library that the
 * ctypes example loads. This file only gives the library a source. */
#include "meshrt/meshrt.h"

int meshrt_capi_test_so_api_version(void);
int meshrt_capi_test_so_api_version(void) { return MESHRT_API_VERSION; }
