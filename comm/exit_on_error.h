#pragma once
// Note [Exiting on an error]
// A process that ends on an error, but still destroys its process group on
// the way out (Python's interpreter does after an uncaught exception), says
// so here first. Rank 0 then does not keep the rendezvous store up for the
// other ranks (World's goodbye, Note [Missing rank]): they are blocked in a
// collective it will never join, so waiting for them would only hold its
// exit, and the launcher's stop of the job, for the whole comm timeout.
// They fail their next collective or heartbeat read instead, naming rank 0.
namespace zero::comm {

void exiting_on_error();
bool is_exiting_on_error();

}  // namespace zero::comm
