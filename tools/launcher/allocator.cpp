#include "allocator.h"

#include <unistd.h>

#include <cstring>
#include <stdexcept>

namespace zero_run {

namespace {

// Where Debian, Fedora and source installs put shared libraries.
const char* const kLibraryDirs[] = {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                                    "/usr/lib", "/usr/local/lib", "/lib/x86_64-linux-gnu", "/lib64"};

struct Known {
  const char* name;
  const char* const* files;          // first found wins
  const char* const* tuning;         // NAME=value, each set only when the user has not set NAME
  const char* package;               // what to install when none is found
};

const char* const kTcmallocFiles[] = {"libtcmalloc_minimal.so.4", "libtcmalloc.so.4", nullptr};
// Release rate 0: freed spans stay in tcmalloc's page heap instead of being
// returned page by page (each return is a fault the next step). The report
// threshold silences tcmalloc's "large alloc" line for every block > 1 GiB.
const char* const kTcmallocTuning[] = {"TCMALLOC_RELEASE_RATE=0",
                                       "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=1099511627776", nullptr};
const char* const kJemallocFiles[] = {"libjemalloc.so.2", nullptr};
// No decay: dirty pages are kept for reuse rather than purged after 10 s.
const char* const kJemallocTuning[] = {"MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1", nullptr};

const Known kKnown[] = {{"tcmalloc", kTcmallocFiles, kTcmallocTuning, "libtcmalloc-minimal4"},
                        {"jemalloc", kJemallocFiles, kJemallocTuning, "libjemalloc2"}};

// NAME's value in `environ`, or nullptr when NAME is not set.
const char* find(char** environ, const char* name) {
  const size_t len = std::strlen(name);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
  }
  return nullptr;
}

std::string lookup(char** environ, const char* name) {
  const char* value = find(environ, name);
  return value ? value : "";
}

std::string find_library(const char* const* files) {
  for (const char* const* f = files; *f != nullptr; ++f) {
    for (const char* dir : kLibraryDirs) {
      const std::string path = std::string(dir) + "/" + *f;
      if (::access(path.c_str(), R_OK) == 0) return path;
    }
  }
  return "";
}

void preload(AllocatorChoice& choice, char** environ, const std::string& library) {
  choice.library = library;
  const std::string existing = lookup(environ, "LD_PRELOAD");
  // First, so that its malloc is the one every later library binds to.
  choice.env.push_back("LD_PRELOAD=" + library + (existing.empty() ? "" : ":" + existing));
}

}  // namespace

AllocatorChoice choose_allocator(const std::string& requested, char** environ) {
  std::string name = requested.empty() ? lookup(environ, "ZERO_ALLOCATOR") : requested;
  const bool by_default = name.empty();
  if (by_default) name = "tcmalloc";
  AllocatorChoice choice;
  choice.name = name;
  if (name == "system") return choice;

  // The user's own preload of an allocator wins over ours, and so does a
  // sanitizer's runtime, which replaces malloc itself and must come first.
  const std::string existing = lookup(environ, "LD_PRELOAD");
  for (const char* owner : {"tcmalloc", "jemalloc", "mimalloc", "libasan", "libtsan", "libclang_rt"}) {
    if (existing.find(owner) != std::string::npos) {
      choice.name = "LD_PRELOAD";
      return choice;
    }
  }

  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), R_OK) != 0) {
      throw std::invalid_argument("--allocator " + name + ": no readable library at that path");
    }
    preload(choice, environ, name);
    return choice;
  }
  for (const Known& known : kKnown) {
    if (name != known.name) continue;
    const std::string library = find_library(known.files);
    if (library.empty()) {
      choice.name = "system";
      choice.note = std::string(known.name) + " is not installed (apt-get install " + known.package +
                    "): the ranks use the system malloc, which maps and unmaps large blocks every step" +
                    (by_default ? "; --allocator system silences this line" : "");
      return choice;
    }
    preload(choice, environ, library);
    for (const char* const* t = known.tuning; *t != nullptr; ++t) {
      const std::string entry = *t;
      if (!find(environ, entry.substr(0, entry.find('=')).c_str())) choice.env.push_back(entry);
    }
    return choice;
  }
  throw std::invalid_argument("--allocator must be tcmalloc, jemalloc, system or a library path; got '" + name + "'" +
                              (requested.empty() ? " (from ZERO_ALLOCATOR)" : ""));
}

}  // namespace zero_run
