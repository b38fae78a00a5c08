#pragma once
// Fault injection for tests: ZERO_FAULT="<point>:<rank>[:<n>]" kills rank
// <rank> with SIGKILL the n-th time (default: the first) it reaches
// <point>, as a machine failure would. Points: save.written (a rank's
// checkpoint file is written, the checkpoint is not complete),
// save.finishing (rank 0 wrote the manifest, before the folder is moved into
// place), load.read (a rank read its part of a checkpoint, before the
// ranks agree), step.reduced (gradients reduced, before the optimizer).
// Unset, a point costs one getenv.
namespace zero::fault {

void reached(const char* point, int rank);

// The same counting without the kill, for points that simulate a failure
// the program recovers from: comm.connected (a rank's gloo connection
// broke right after connecting; the group connects again, see
// Note [Connecting a gloo group] in comm/gloo.cpp); comm.shm_segment (rank
// 0 could not create a group's shared-memory segment: the group uses gloo);
// weights.read (load_weights fails to read a bucket, half-way through).
bool fires(const char* point, int rank);

}  // namespace zero::fault
