#pragma once
// The job's folder for in-memory checkpoint copies (Note [Memory folder] in
// memory_folder.cpp).
namespace zero_run {

// Removes the folder MemoryFolder made, if any (also before a
// re-raised signal ends the launcher, when no destructor runs).
void remove_memory_folder();

// Makes the folder for the job's lifetime and removes it at the end.
struct MemoryFolder {
  MemoryFolder();
  ~MemoryFolder() { remove_memory_folder(); }
  MemoryFolder(const MemoryFolder&) = delete;
  MemoryFolder& operator=(const MemoryFolder&) = delete;
};

}  // namespace zero_run
