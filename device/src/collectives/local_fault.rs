/// Index of the first local fault word in [`super::CollContext::state`].
pub const BASE: usize = 2 * super::COUNTER_WORDS;
/// A copy of the host's abort word, once a wait has seen it set.
pub const ABORT: usize = BASE;
/// `seq + 1` of the call whose waits must stop on this rank.
pub const STOP: usize = BASE + 1;
/// `%globaltimer` of the last look at the host's abort word: one waiting thread at a
/// time looks, at most every [`HOST_LOOK_NS`].
pub const LAST_LOOK: usize = BASE + 2;
/// Least time between two looks at the host's abort word by this rank's waits.
pub const HOST_LOOK_NS: u64 = 50_000;
/// The value of the local [`ABORT`] copy when a look found, instead of the host's abort
/// word, the record of a call that gave up for good ([`fault::TIMEOUT`] or
/// [`fault::ABORTED`](super::fault::ABORTED), never cleared): the communicator cannot
/// be used any more, so the waits of the calls already queued behind that one give up at
/// once (before, each waited a device timeout of its own, and a rank with a thousand
/// calls queued on its stream behind a stalled peer took a thousand timeouts to report
/// it or to close).
///
/// [`fault::TIMEOUT`]: super::fault::TIMEOUT
pub const AFTER_FAILURE: u64 = u64::MAX - 1;
/// A copy of the host's [`fault::LEFT`](super::fault::LEFT) word (contexts with
/// [`guard::LEFT`](super::guard::LEFT)), taken at the same looks as the abort word.
pub const LEFT: usize = BASE + 3;
/// A copy of the host's [`fault::LEFT_PEERS`](super::fault::LEFT_PEERS) word (contexts
/// with [`guard::PEERS`](super::guard::PEERS)), taken at the same looks as the abort
/// word.
pub const LEFT_PEERS: usize = BASE + 4;
