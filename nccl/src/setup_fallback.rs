//! When our side of a communicator cannot be set up on some rank (GPU memory, GPUs that
//! cannot map each other's memory, a setting one process reads differently), the
//! communicator runs on the real NCCL alone instead of failing, as long as every rank has a
//! real communicator (set up before ours for this reason).
//!
//! # How the ranks agree
//!
//! Our set-up is collective: a rank whose set-up fails drops its bootstrap, and the others
//! then fail too ("rank 1 is gone"), inside their set-up or in the all-gather that ends
//! it. So our bootstrap cannot carry the agreement. The real communicator can: every rank
//! that did not finish ours (all of them, when one did not) all-gathers a short report
//! ([`REPORT_BYTES`]: whether its own set-up failed or it saw a peer leave, and the
//! message) over the real NCCL, on a stream polled against the bootstrap's timeout, so a
//! rank that died instead of failing is a clear error after that time and not a hang. Every
//! rank then logs the same reason, the failing rank's own.
//!
//! `MSCCLPP_NCCL_SETUP_FALLBACK=0` (agreed over the bootstrap before our set-up: strict if
//! any rank says so) makes a failure of ours fail `ncclCommInitRank*` as before.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use cudarc::driver::{result as cu, sys as cusys};
use mscclpp_host::bootstrap::BootstrapError;
use mscclpp_host::communicator::CommError;

use crate::error::Failure;
use crate::system_nccl::RealComm;
use crate::system_nccl::{Ptr, Real};
use crate::types::result;

/// The variable that turns the fallback off (`0`, `off`, `no`, `false`).
pub const SETUP_FALLBACK_ENV: &str = "MSCCLPP_NCCL_SETUP_FALLBACK";

/// Bytes of one rank's report: a kind byte, then the message (UTF-8, cut to fit,
/// zero-padded).
pub const REPORT_BYTES: usize = 256;

/// The report's kind byte: this rank's own set-up failed.
const OWN: u8 = 1;
/// The report's kind byte: this rank's failed because a peer left or died.
const PEER: u8 = 2;

/// `ncclUint8`.
const NCCL_UINT8: c_int = 1;

/// Whether this process allows the fallback (the ranks agree before using it).
pub fn enabled() -> bool {
    mscclpp_host::settings::Settings::global_or_default().nccl_setup_fallback
}

/// Whether `e` only reports that a peer left (its own failure is elsewhere).
pub fn is_peer_loss(e: &CommError) -> bool {
    matches!(
        e,
        CommError::Bootstrap(BootstrapError::PeerLost { .. } | BootstrapError::PeerClosed { .. })
            | CommError::Aborted(_)
    )
}

/// This rank's report: `peer` when its set-up failed only because a peer left.
pub fn encode_report(peer: bool, msg: &str) -> [u8; REPORT_BYTES] {
    let mut out = [0u8; REPORT_BYTES];
    out[0] = if peer { PEER } else { OWN };
    let mut end = msg.len().min(REPORT_BYTES - 1);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    out[1..1 + end].copy_from_slice(&msg.as_bytes()[..end]);
    out
}

/// Reads a report: `(own failure, message)`; `None` for bytes no rank wrote.
pub fn decode_report(b: &[u8]) -> Option<(bool, String)> {
    let (&kind, rest) = b.split_first()?;
    let own = match kind {
        OWN => true,
        PEER => false,
        _ => return None,
    };
    let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
    Some((own, String::from_utf8_lossy(&rest[..end]).into_owned()))
}

/// Why the communicator runs on the real NCCL, from every rank's report: the ranks whose own
/// set-up failed, with their messages (or, when every rank only saw a peer leave, the
/// first report), each led by its rank unless the message already is.
pub fn summarize(reports: &[Vec<u8>]) -> String {
    let said = |r: usize, m: &str| {
        let lead = format!("rank {r}: ");
        if m.starts_with(&lead) {
            m.to_string()
        } else {
            format!("{lead}{m}")
        }
    };
    let decoded: Vec<(usize, Option<(bool, String)>)> = reports
        .iter()
        .enumerate()
        .map(|(r, b)| (r, decode_report(b)))
        .collect();
    let own: Vec<String> = decoded
        .iter()
        .filter_map(|(r, d)| match d {
            Some((true, m)) => Some(said(*r, m)),
            _ => None,
        })
        .collect();
    if !own.is_empty() {
        return own.join("; ");
    }
    decoded
        .iter()
        .find_map(|(r, d)| d.as_ref().map(|(_, m)| said(*r, m)))
        .unwrap_or_else(|| "no rank said why".into())
}

/// All-gathers `mine` over the real communicator `rc` (this rank `rank` of `nranks`), waiting
/// at most `deadline` for every rank. On a timeout the real communicator is aborted (it
/// must not be used again) and the error says so.
pub fn gather_reports(
    call: &str,
    real: &Real,
    rc: RealComm,
    rank: usize,
    nranks: usize,
    mine: &[u8; REPORT_BYTES],
    deadline: Duration,
) -> Result<Vec<Vec<u8>>, Failure> {
    let cuda = |what: &str, e: cudarc::driver::DriverError| {
        Failure::new(
            result::UNHANDLED_CUDA_ERROR,
            format!("{call}: agreeing on the fallback: {what}: {e:?}"),
        )
    };
    let all_gather = real.fns.all_gather.ok_or_else(|| {
        Failure::usage(format!(
            "{call}: the real NCCL ({}) does not export ncclAllGather",
            real.path
        ))
    })?;
    let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking)
        .map_err(|e| cuda("cuStreamCreate", e))?;
    let bytes = REPORT_BYTES * nranks;
    // SAFETY: a plain allocation in the current context (the set-up's GPU).
    let buf = match unsafe { cu::malloc_sync(bytes) } {
        Ok(b) => b,
        Err(e) => {
            // SAFETY: the stream made above, unused.
            let _ = unsafe { cu::stream::destroy(stream) };
            return Err(cuda("cuMemAlloc", e));
        }
    };
    let mine_at = buf + (REPORT_BYTES * rank) as u64;
    let release = || {
        // SAFETY: our allocation and stream; nothing runs on them any more.
        unsafe {
            let _ = cu::free_sync(buf);
            let _ = cu::stream::destroy(stream);
        }
    };
    // On our stream, so the all-gather below reads it: `cuMemcpyHtoD` from pageable memory
    // may return before its DMA lands, and a non-blocking stream does not wait for it. From
    // pageable memory the asynchronous copy stages `mine` before it returns.
    // SAFETY: `buf` holds `nranks` reports; this rank's slot is in range; our stream.
    if let Err(e) = unsafe { cu::memcpy_htod_async(mine_at, &mine[..], stream) } {
        release();
        return Err(cuda("cuMemcpyHtoDAsync", e));
    }
    // SAFETY: NCCL's signature; an in-place all-gather (the send buffer is this rank's slot
    // of the receive buffer), both device memory of this context, on our stream.
    let code = unsafe {
        all_gather(
            mine_at as Ptr,
            buf as Ptr,
            REPORT_BYTES,
            NCCL_UINT8,
            rc.0,
            stream as Ptr,
        )
    };
    if let Err(f) = crate::system_nccl::real_result(call, real, rc.0, code) {
        release();
        return Err(f);
    }
    let start = Instant::now();
    loop {
        // SAFETY: our stream.
        match unsafe { cusys::cuStreamQuery(stream) } {
            cusys::CUresult::CUDA_SUCCESS => break,
            cusys::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            cusys::CUresult::CUDA_ERROR_NOT_READY => {
                if let Some(abort) = real.fns.comm_abort {
                    // SAFETY: NCCL's signature; the real communicator, not used after this.
                    let _ = unsafe { abort(rc.0) };
                }
                // The buffer and stream stay: the aborted kernel may still hold them.
                return Err(Failure::new(
                    result::REMOTE_ERROR,
                    format!(
                        "{call}: not every rank came to agree on running on the real NCCL \
                         within {deadline:?} (a rank died during set-up?)"
                    ),
                ));
            }
            r => {
                release();
                return Err(Failure::new(
                    result::UNHANDLED_CUDA_ERROR,
                    format!("{call}: agreeing on the fallback: the real all-gather: {r:?}"),
                ));
            }
        }
    }
    let mut all = vec![0u8; bytes];
    // SAFETY: `buf` holds `bytes`, written by the finished all-gather.
    let got = unsafe { cu::memcpy_dtoh_sync(&mut all, buf) };
    release();
    got.map_err(|e| cuda("cuMemcpyDtoH", e))?;
    Ok(all.chunks(REPORT_BYTES).map(<[u8]>::to_vec).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_cut_at_a_character() {
        let r = encode_report(false, "cuMemAlloc: out of memory");
        assert_eq!(
            decode_report(&r),
            Some((true, "cuMemAlloc: out of memory".into()))
        );
        let r = encode_report(true, "rank 1 is gone");
        assert_eq!(decode_report(&r), Some((false, "rank 1 is gone".into())));
        // 300 two-byte characters do not fit: the cut falls between characters.
        let long = "é".repeat(300);
        let (_, m) = decode_report(&encode_report(false, &long)).unwrap();
        assert!(m.chars().all(|c| c == 'é'), "{m}");
        assert_eq!(m.chars().count(), (REPORT_BYTES - 1) / 2);
        assert_eq!(decode_report(&[0u8; REPORT_BYTES]), None);
        assert_eq!(decode_report(&[]), None);
    }

    #[test]
    fn peer_losses_are_told_from_own_failures() {
        use mscclpp_host::bootstrap::Op;
        let closed = BootstrapError::PeerClosed {
            rank: 0,
            op: Op::Barrier,
            peer: 1,
            gave_up: None,
            said: None,
        };
        assert!(is_peer_loss(&CommError::Bootstrap(closed)));
        let lost = BootstrapError::PeerLost {
            rank: 0,
            op: Op::Barrier,
            peer: 1,
            detail: "connection reset".into(),
        };
        assert!(is_peer_loss(&CommError::Bootstrap(lost)));
        assert!(is_peer_loss(&CommError::Aborted("rank 1 is gone".into())));
        assert!(!is_peer_loss(&CommError::InvalidArgument("scratch".into())));
        let timeout = BootstrapError::Timeout {
            rank: 0,
            op: Op::Barrier,
            waiting_for: "rank 1".into(),
            after: std::time::Duration::from_secs(1),
            gave_up: None,
            stuck: Box::default(),
        };
        assert!(!is_peer_loss(&CommError::Bootstrap(timeout)));
    }

    #[test]
    fn summary_names_the_ranks_that_failed_themselves() {
        let reports = vec![
            encode_report(true, "rank 1 is gone").to_vec(),
            encode_report(false, "rank 1: out of memory").to_vec(),
            encode_report(false, "peer access unsupported").to_vec(),
        ];
        assert_eq!(
            summarize(&reports),
            "rank 1: out of memory; rank 2: peer access unsupported"
        );
        let only_peers = vec![
            encode_report(true, "rank 1 is gone").to_vec(),
            encode_report(true, "rank 0 is gone").to_vec(),
        ];
        assert_eq!(summarize(&only_peers), "rank 0: rank 1 is gone");
        // A message that names another rank first is still led by its own.
        let named = vec![encode_report(false, "rank 3: x").to_vec()];
        assert_eq!(summarize(&named), "rank 0: rank 3: x");
        assert_eq!(summarize(&[vec![0; REPORT_BYTES]]), "no rank said why");
    }
}
