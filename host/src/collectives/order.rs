//! Call order across streams: a communicator's GPU calls run in the order they were made,
//! whatever stream each was made on, as NCCL runs them.
//!
//! Every call's work goes on the caller's stream, and the kernels of one call find their
//! peers' kernels of the same call by counting calls. Two calls made on two streams would
//! otherwise run in whatever order the GPU picks, and the ranks could pick differently: rank
//! 0 running its all-gather while rank 1 runs its reduce-scatter (PyTorch's FSDP2 issues
//! both from two streams of one communicator). So after each call an event is recorded on
//! its stream, and a call on another stream first makes its stream wait for that event.
//! A call on the same stream as the one before needs no wait: the stream orders them.
//!
//! CUDA graphs: calls captured into one graph are ordered among themselves (the wait joins
//! the streams inside the capture and becomes an edge of the graph; recording an event in a
//! capture adds no node, so a replay costs nothing more). Calls made outside any capture are
//! ordered among themselves. A captured call and an uncaptured one are not ordered with each
//! other (CUDA forbids the dependency): the graph's launch is itself stream-ordered, as
//! with NCCL. Each capture, and the uncaptured calls, keep their own event ([`Lanes`]).
//!
//! What it costs: a capture query and an event record per call (host side; nothing in a
//! replayed graph), and a stream wait when the stream changes.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;

use crate::communicator::CommError;
use crate::cuda::{CudaContext, CudaError, CudaStream, check};

/// Where a stream's work goes: run now, into a capture (by its id), or unknown (the query
/// failed, or the capture was invalidated: no order is kept for such a call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    /// Not being captured: the work runs when the stream reaches it.
    Eager,
    /// Being captured into the graph of capture `id`.
    Captured(u64),
    /// Neither known.
    Unknown,
}

/// The last call made in one lane: its stream, and whether its event was recorded after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Last {
    /// The stream of the call.
    pub(super) stream: usize,
    /// The event of the lane was recorded on that stream after the call's work.
    pub(super) recorded: bool,
}

/// What a call on `stream` must do before its work, given the last call of its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Before {
    /// Nothing: first call of the lane, or the same stream as the last call.
    Nothing,
    /// Make the stream wait for the lane's event.
    Wait,
    /// The last call was on another stream and its event could not be recorded: the order
    /// cannot be kept, and the call is refused.
    Refuse,
}

/// The step before a call on `stream` in `lane` whose last call was `last`.
pub(super) fn before(lane: Lane, last: Option<Last>, stream: usize) -> Before {
    match (lane, last) {
        (Lane::Unknown, _) | (_, None) => Before::Nothing,
        (_, Some(l)) if l.stream == stream => Before::Nothing,
        (_, Some(Last { recorded: true, .. })) => Before::Wait,
        (
            _,
            Some(Last {
                recorded: false, ..
            }),
        ) => Before::Refuse,
    }
}

/// The most lanes remembered (the uncaptured calls and the most recent captures); the
/// least recently used capture is forgotten first. A capture is forgotten only after 15
/// newer ones made calls on this communicator while it was still being captured, which no
/// program does.
const LANES: usize = 16;

/// One lane's event and last call.
struct LaneState {
    lane: Lane,
    event: sys::CUevent,
    last: Option<Last>,
    /// Use counter value at the lane's last call (least recently used is forgotten first).
    used: u64,
}

/// Each lane's state, most recent use counted.
struct Lanes {
    lanes: Vec<LaneState>,
    uses: u64,
}

/// The call order of one communicator's GPU calls (see the [module](self)).
pub(super) struct CallOrder {
    state: Mutex<Lanes>,
    /// The context the events belong to (bound to destroy them).
    ctx: OnceLock<Arc<CudaContext>>,
}

impl std::fmt::Debug for CallOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.state.lock().map_or(0, |s| s.lanes.len());
        f.debug_struct("CallOrder").field("lanes", &n).finish()
    }
}

// SAFETY: the raw event handles are used only under the mutex, and CUDA events may be used
// from any thread of the process.
unsafe impl Send for CallOrder {}
// SAFETY: as for Send; every access to the handles goes through `state`'s mutex.
unsafe impl Sync for CallOrder {}

/// A call in progress: when it drops, the lane's event is recorded on the call's stream.
pub(super) struct Ordered<'a> {
    order: &'a CallOrder,
    stream: sys::CUstream,
    lane: Lane,
}

impl CallOrder {
    /// No call made yet.
    pub(super) fn new() -> CallOrder {
        CallOrder {
            state: Mutex::new(Lanes {
                lanes: Vec::new(),
                uses: 0,
            }),
            ctx: OnceLock::new(),
        }
    }

    /// Orders a call on `stream` after this communicator's previous call of the same lane:
    /// makes `stream` wait for that call's event where the stream differs. The call's work
    /// follows; when the returned guard drops, the lane's event is recorded after it. The
    /// stream's context must be bound on this thread.
    pub(super) fn enter(&self, call: &str, stream: &CudaStream) -> Result<Ordered<'_>, CommError> {
        let raw = stream.cu_stream();
        let lane = lane_of(raw);
        if lane != Lane::Unknown {
            self.ctx.get_or_init(|| stream.context().clone());
        }
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = s.find(lane) {
            let st = &s.lanes[i];
            match before(lane, st.last, raw as usize) {
                Before::Nothing => {}
                // SAFETY: a live stream of the bound context and an event of that context
                // (recorded after the lane's last call).
                Before::Wait => check("cuStreamWaitEvent", unsafe {
                    sys::cuStreamWaitEvent(raw, st.event, 0)
                })?,
                Before::Refuse => {
                    return Err(CommError::State(format!(
                        "{call}: the previous call of this communicator could not be marked on \
                         its stream (cuEventRecord failed), so this call on another stream \
                         cannot be ordered after it"
                    )));
                }
            }
        }
        Ok(Ordered {
            order: self,
            stream: raw,
            lane,
        })
    }
}

impl Lanes {
    /// The index of `lane`'s state, if it has one.
    fn find(&self, lane: Lane) -> Option<usize> {
        self.lanes.iter().position(|l| l.lane == lane)
    }

    /// The index of `lane`'s state, made (with its event) if it has none, forgetting the
    /// least recently used lane beyond [`LANES`].
    fn get_or_make(&mut self, lane: Lane) -> Result<usize, CudaError> {
        if let Some(i) = self.find(lane) {
            return Ok(i);
        }
        if self.lanes.len() >= LANES
            && let Some(i) = (0..self.lanes.len())
                .filter(|&i| self.lanes[i].lane != Lane::Eager)
                .min_by_key(|&i| self.lanes[i].used)
        {
            let old = self.lanes.swap_remove(i);
            if !old.event.is_null() {
                // SAFETY: an event this state made and no longer refers to; destroying an
                // event whose record is pending is allowed (its resources go once it ends).
                unsafe { sys::cuEventDestroy_v2(old.event) };
            }
        }
        let mut event = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the caller bound the stream's context.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        })?;
        self.lanes.push(LaneState {
            lane,
            event,
            last: None,
            used: 0,
        });
        Ok(self.lanes.len() - 1)
    }
}

impl Drop for Ordered<'_> {
    fn drop(&mut self) {
        if self.lane == Lane::Unknown {
            return;
        }
        let mut s = self.order.state.lock().unwrap_or_else(|e| e.into_inner());
        s.uses += 1;
        let used = s.uses;
        let recorded = match s.get_or_make(self.lane) {
            Ok(i) => {
                // SAFETY: the call's live stream (the caller's borrow outlives this guard) and
                // an event of its context.
                let r = unsafe { sys::cuEventRecord(s.lanes[i].event, self.stream) };
                let st = &mut s.lanes[i];
                st.used = used;
                st.last = Some(Last {
                    stream: self.stream as usize,
                    recorded: r == sys::CUresult::CUDA_SUCCESS,
                });
                return;
            }
            Err(_) => false,
        };
        // No event could be made: the lane has no state, so the next call on another
        // stream would not wait. Keep a state without an event that refuses it instead.
        s.lanes.push(LaneState {
            lane: self.lane,
            event: std::ptr::null_mut(),
            last: Some(Last {
                stream: self.stream as usize,
                recorded,
            }),
            used,
        });
    }
}

impl Drop for CallOrder {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if s.lanes.is_empty() {
            return;
        }
        if let Some(ctx) = self.ctx.get() {
            let _ = ctx.bind_to_thread();
        }
        for l in s.lanes.drain(..) {
            if !l.event.is_null() {
                // SAFETY: an event this state made; nothing refers to it any more.
                unsafe { sys::cuEventDestroy_v2(l.event) };
            }
        }
    }
}

/// The lane of `stream`'s work now (see [`Lane`]).
fn lane_of(stream: sys::CUstream) -> Lane {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    // SAFETY: a live stream and out-pointers to locals; the optional outputs are null.
    let r = unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    match (r, status) {
        (
            sys::CUresult::CUDA_SUCCESS,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        ) => Lane::Eager,
        (
            sys::CUresult::CUDA_SUCCESS,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
        ) => Lane::Captured(id),
        _ => Lane::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::{Before, Lane, Last, before};

    const A: usize = 0x1000;
    const B: usize = 0x2000;

    fn last(stream: usize, recorded: bool) -> Option<Last> {
        Some(Last { stream, recorded })
    }

    #[test]
    fn a_call_on_another_stream_waits_for_the_last_call_of_its_lane() {
        for lane in [Lane::Eager, Lane::Captured(7)] {
            assert_eq!(before(lane, last(A, true), B), Before::Wait, "{lane:?}");
            assert_eq!(before(lane, last(A, true), A), Before::Nothing, "{lane:?}");
            assert_eq!(before(lane, None, B), Before::Nothing, "{lane:?}");
        }
    }

    #[test]
    fn an_unrecorded_last_call_refuses_a_call_on_another_stream_only() {
        assert_eq!(before(Lane::Eager, last(A, false), B), Before::Refuse);
        assert_eq!(before(Lane::Eager, last(A, false), A), Before::Nothing);
    }

    #[test]
    fn a_call_of_unknown_lane_is_not_ordered() {
        assert_eq!(before(Lane::Unknown, last(A, true), B), Before::Nothing);
        assert_eq!(before(Lane::Unknown, last(A, false), B), Before::Nothing);
    }
}
