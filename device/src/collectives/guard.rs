/// For the kernels inside a host of a communicator that spans hosts: every call first
/// reads [`fault::CROSS_BROKEN`](super::fault::CROSS_BROKEN), and once a round across
/// hosts failed on this rank its descriptor is [`desc::BROKEN`](super::desc::BROKEN), so
/// the host's other ranks fail the call (a mismatch) instead of taking what this rank's
/// buffers hold. On a GPU the whole of a call across hosts is queued at once, so the
/// local kernels after a failed round still run. Off elsewhere (the word lives in pinned
/// host memory: a read costs a PCIe round trip that one-host calls do not pay).
pub const CROSS: u64 = 1;
/// For the context whose call counter every rank of the group advances alike (the
/// collectives', not the send/receive or cross-host step contexts, which count their
/// own operations): its waits give up on a call that a rank which left never made
/// ([`fault::LEFT`](super::fault::LEFT)).
pub const LEFT: u64 = 2;
/// For the send/receive context: a wait for a rank that left with its work done
/// ([`fault::LEFT_PEERS`](super::fault::LEFT_PEERS)) gives up once it has polled again
/// after learning of the departure (whatever that rank wrote before it left is visible
/// by then, so what is still missing will never come).
pub const PEERS: u64 = 4;
