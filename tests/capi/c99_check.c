/* Compile check: meshrt.h is C99 (built with -std=c99 -pedantic -Werror -Wall -Wextra). */
#include "meshrt/meshrt.h"

int meshrt_c99_check(void);

int meshrt_c99_check(void) {
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  meshrt_unique_id_t id;
  meshrt_status_t st = MESHRT_SUCCESS;
  (void)id;
  cfg.timeout_s = 10.0;
  if (cfg.size != sizeof(meshrt_comm_config_t)) st = MESHRT_ERROR_INTERNAL;
  return (int)st + MESHRT_API_VERSION;
}
