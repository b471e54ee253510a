#include "runtime/plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

#include "meshrt/version.h"
#include "runtime/env.h"
#include "runtime/error.h"

namespace meshrt::detail {

namespace {

struct Loaded {
  std::string path;
  const void* table = nullptr;
};

std::mutex& plugins_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, Loaded>& plugins() {
  static std::map<std::string, Loaded> m;
  return m;
}

std::string core_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&plugin_search_path), &info) == 0 || !info.dli_fname) {
    return "";
  }
  std::string f = info.dli_fname;
  const size_t slash = f.rfind('/');
  return slash == std::string::npos ? "." : f.substr(0, slash);
}

std::string searched() {
  std::string s;
  for (const std::string& d : plugin_search_path()) s += (s.empty() ? "" : ", ") + d;
  return s.empty() ? "nowhere" : s;
}

// What a file that is not a regular file is ("a FIFO (named pipe)", ...), for messages.
const char* file_type_name(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// Refuses a plugin path (found on the search path) that is not a regular file: dlopen of a FIFO
// blocks until something writes to it, and a device or directory is no library either.
void check_regular_file(const std::string& name, const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;  // dlopen names a missing one
  MESHRT_FAIL("cannot load the " << name << " backend: " << path << " is "
                                 << file_type_name(st.st_mode)
                                 << ", not a regular file (a shared library): remove it, or set "
                                    "MESHRT_BACKEND_PATH to the folder of the real "
                                 << plugin_file_name(name));
}

// Opens `path` and calls its entry point; throws naming the file and the reason.
const void* open_plugin(const std::string& name, const std::string& path) {
  const std::string file = plugin_file_name(name);
  if (path.find('/') != std::string::npos) check_regular_file(name, path);
  // RTLD_GLOBAL: an MPI library loaded on behalf of the plugin opens its own components, which
  // look its symbols up globally (as mpi4py loads libmpi).
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  MESHRT_CHECK(h != nullptr, "cannot load the " << name << " backend (" << file
                                                << "): " << dlerror() << " (searched " << searched()
                                                << "; set MESHRT_BACKEND_PATH to its folder)");
  auto entry = reinterpret_cast<PluginEntry>(dlsym(h, MESHRT_PLUGIN_ENTRY));
  MESHRT_CHECK(entry != nullptr, "cannot load the " << name << " backend: " << path
                                                    << " has no " MESHRT_PLUGIN_ENTRY
                                                       " entry point: not a meshrt plugin");
  const PluginInfo* info = entry(kPluginAbi, MESHRT_VERSION_STRING);
  MESHRT_CHECK(info != nullptr && info->abi == kPluginAbi &&
                   std::strcmp(info->version, MESHRT_VERSION_STRING) == 0 &&
                   std::strcmp(info->name, name.c_str()) == 0 && info->table != nullptr,
               "cannot load the " << name << " backend: " << path << " is "
                                  << (info ? std::string(info->name) + " " + info->version +
                                                 " (plugin ABI " + std::to_string(info->abi) + ")"
                                           : std::string("a plugin that refused"))
                                  << ", not the " << name << " plugin of meshrt "
                                  << MESHRT_VERSION_STRING << " (plugin ABI " << kPluginAbi
                                  << "): install the plugin built with this libmeshrt.so");
  return info->table;
}

}  // namespace

std::string plugin_file_name(const std::string& name) { return "libmeshrt-" + name + ".so"; }

std::vector<std::string> plugin_search_path() {
  std::vector<std::string> dirs;
  const std::string env = env_or("MESHRT_BACKEND_PATH");
  size_t start = 0;
  while (start <= env.size() && !env.empty()) {
    const size_t colon = env.find(':', start);
    const std::string d = env.substr(start, colon == std::string::npos ? colon : colon - start);
    if (!d.empty()) dirs.push_back(d);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (const std::string core = core_folder(); !core.empty()) dirs.push_back(core);
  return dirs;
}

std::string find_plugin(const std::string& name) {
  for (const std::string& d : plugin_search_path()) {
    const std::string p = d + "/" + plugin_file_name(name);
    if (access(p.c_str(), F_OK) == 0) return p;
  }
  return "";
}

const void* load_plugin(const std::string& name) {
  std::lock_guard<std::mutex> lk(plugins_mu());
  if (auto it = plugins().find(name); it != plugins().end()) return it->second.table;
  std::string path = find_plugin(name);
  // Not on the search path: the dynamic loader's own (LD_LIBRARY_PATH, the cache), whose dlerror()
  // then says why it is not there either.
  if (path.empty()) path = plugin_file_name(name);
  const void* table = open_plugin(name, path);
  plugins()[name] = {path, table};
  return table;
}

std::string loaded_plugin_path(const std::string& name) {
  std::lock_guard<std::mutex> lk(plugins_mu());
  auto it = plugins().find(name);
  return it == plugins().end() ? "" : it->second.path;
}

}  // namespace meshrt::detail
