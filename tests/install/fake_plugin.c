/* A fake backend plugin for the loader's checks (runtime/plugin.h): built as libmeshrt-<name>.so,
 * its entry point returns a PluginInfo (plugin.h's layout) with FAKE_ABI (default 1),
 * FAKE_VERSION (default "0.0.0": another meshrt's) and FAKE_NAME, or NULL with -DFAKE_REFUSE;
 * with -DFAKE_NO_ENTRY it has no entry point at all. Used by install_test.sh plugins and by
 * tests/runtime/test_plugin.cpp. */
#include <stddef.h>
#include <stdint.h>

#ifndef FAKE_NAME
#define FAKE_NAME "cuda"
#endif
#ifndef FAKE_ABI
#define FAKE_ABI 1
#endif
#ifndef FAKE_VERSION
#define FAKE_VERSION "0.0.0"
#endif

#ifdef FAKE_NO_ENTRY
int meshrt_fake_plugin_unit;
#else
struct fake_plugin_info {
  uint32_t abi;
  const char* version;
  const char* name;
  const void* table;
};

static const int fake_table = 42;

const struct fake_plugin_info* meshrt_backend_init_v1(uint32_t core_abi, const char* core_version);
const struct fake_plugin_info* meshrt_backend_init_v1(uint32_t core_abi, const char* core_version) {
  static const struct fake_plugin_info info = {FAKE_ABI, FAKE_VERSION, FAKE_NAME, &fake_table};
  (void)core_abi;
  (void)core_version;
#ifdef FAKE_REFUSE
  (void)info;
  return NULL;
#else
  return &info;
#endif
}
#endif
