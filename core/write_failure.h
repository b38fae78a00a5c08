#pragma once
// The record of a failed write (Note [Failed writes]): what a writer that
// runs beside training (the monitors' thread, the log, the progress report)
// found when the disk was full or failed, kept until the engine takes it at
// its next step boundary. Throws nothing (core/).
//
// Note [Failed writes]: a writer that is not on the training thread cannot
// throw into it, and a writer on rank 0 alone cannot stop the other ranks
// by itself (they would wait for it in their next collective until the
// comm timeout, and rank 0's goodbye waits for them: Note [Missing rank]).
// So each writer reports its first failure here, naming itself, the file
// and errno's text, and logs it at once: the rank that hit it says so first.
// The engine (engine/telemetry.cpp) carries "a write failed on this rank"
// in the collectives it already runs at a step boundary (the monitors'
// loss all-reduce each step, the progress line's), so every rank learns it
// in the same collective and raises an EngineError at the same boundary:
// no extra collective per step, no rank left waiting. A checkpoint's flush
// of the monitors agrees on it too (a collective the save pays anyway).
// Checkpoint files are written on the training thread and raise their
// CheckpointError themselves (ckpt/file_io.cpp).
#include <string>

namespace zero::write_failure {

// Records "<writer>: writing <path> failed: <errno's text>" if nothing is
// recorded yet and logs it as an error; returns the text.
std::string report(const std::string& writer, const std::string& path, int error_number);
// Whether a failure is recorded (cheap: an atomic load).
bool pending();
// The recorded failure, cleared (empty when none).
std::string take();
// The errors of a disk that is full or fails (ENOSPC, EDQUOT, EFBIG, EIO,
// EROFS): what makes a log line's failure fatal. A closed pipe or terminal
// is not the disk's fault and is not reported.
bool is_disk_error(int error_number);

}  // namespace zero::write_failure
