/* libmeshrt.so's CUDA backend plugin seen by a C program (install_test.sh plugins): a world of one
 * rank on CUDA devices through meshrt_comm_init_all. Prints "CUDA OK: 1 rank" or, when the
 * world cannot be made, "FAILED <status>: <last error>" (on one line: the error is one). */
#include <stdio.h>

#include "meshrt/meshrt.h"

int main(void) {
  meshrt_comm_t comm = NULL;
  meshrt_comm_config_t cfg = MESHRT_COMM_CONFIG_INITIALIZER;
  meshrt_status_t st = meshrt_init(MESHRT_API_VERSION);
  cfg.device_type = MESHRT_DEVICE_CUDA;
  if (st == MESHRT_SUCCESS) st = meshrt_comm_init_all(&comm, 1, NULL, &cfg);
  if (st != MESHRT_SUCCESS) {
    printf("FAILED %s: %s\n", meshrt_status_string(st), meshrt_last_error());
    return 1;
  }
  meshrt_comm_destroy(comm);
  printf("CUDA OK: 1 rank\n");
  return 0;
}
