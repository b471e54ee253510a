// MESHRT_PLUGIN_API marks the internal functions and classes that libmeshrt.so exports for its
// backend plugins (libmeshrt-mpi.so, ...; runtime/plugin.h). The attribute makes them visible;
// what leaves libmeshrt.so is the plugin interface listed in cmake/libmeshrt.map (what the
// plugins import, nothing else): a declaration marked here needs its entry there too. They are
// not part of the public API: no installed header declares them, and a plugin is loaded only by
// the core of its own version (the entry point checks it), so they may change in any release.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define MESHRT_PLUGIN_API __attribute__((visibility("default")))
#else
#define MESHRT_PLUGIN_API
#endif
