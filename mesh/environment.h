// The one check of meshrt's environment, run where a program enters meshrt: every command of the
// command line (bench::check_process_environment), meshrt_init and every meshrt_comm_init* /
// meshrt_comm_adopt_nccl of the C API. It sits in mesh/, the lowest layer that sees both the
// kernels' variables and the collectives'.
#pragma once

namespace meshrt {

// Checks every MESHRT_ variable the library reads, before any of them is read where a refusal
// could not be returned (a stream's worker thread, an exit handler): the table's switches, choices
// and whole numbers and MESHRT_LOG_LEVEL (runtime/env.h's check_environment), then the free-form
// ones through their own readers: MESHRT_COMM_TIMEOUT, MESHRT_FAULT and MESHRT_FLIGHT_DIR
// (CommConfig::from_env), MESHRT_RENDEZVOUS and MESHRT_HOST_ISA. Throws meshrt::Error naming the
// variable, its value and what is accepted; warns once about MESHRT_ names it does not know.
// (MESHRT_BACKEND_PATH and MESHRT_RUN_ID take any value.)
void validate_environment();

}  // namespace meshrt
