#pragma once
// The one logger of zero. Rank 0 speaks by default; other ranks speak only
// errors unless ZERO_LOG_RANKS=all (or a list such as "0,3"). A line from a
// rank other than 0 starts with "[rank r]". ZERO_LOG_LEVEL=debug|info|warn|error.
#include <sstream>
#include <string>

namespace zero::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

// Called once the process knows its rank (comm does it at rendezvous).
void set_rank(int rank);
int rank();
void set_level(Level level);
bool enabled(Level level);
// Writes one line: info and debug to stdout, warnings and errors to stderr.
void write(Level level, const std::string& subsystem, const std::string& message);
// Writes a warning only the first time `key` is seen in this process.
void warn_once(const std::string& key, const std::string& subsystem, const std::string& message);

inline void debug(const std::string& subsystem, const std::string& m) { write(Level::Debug, subsystem, m); }
inline void info(const std::string& subsystem, const std::string& m) { write(Level::Info, subsystem, m); }
inline void warn(const std::string& subsystem, const std::string& m) { write(Level::Warn, subsystem, m); }
inline void error(const std::string& subsystem, const std::string& m) { write(Level::Error, subsystem, m); }

}  // namespace zero::log
