//! `--baseline`: the 1-rank reference of the scaling efficiency, measured in the same run.
//!
//! Before the multi-rank training, rank 0 trains the same model alone ([`Config::solo`]:
//! the same per-rank batch, steps, warm-up, buckets and optimizer; one rank, so no
//! all-reduce and no bootstrap traffic inside the loop) while the other ranks wait. Then
//! every run's lines and summary report
//!
//! ```text
//! scaling = samples/s of the n-rank run / (n x samples/s of the 1-rank baseline)
//!         = 1-rank step time / n-rank step time   (same samples per rank per step)
//! ```
//!
//! The wait is bounded without a barrier that would have to outlast the whole baseline:
//! rank 0 sends every waiting rank a heartbeat over the bootstrap (after a step, at most
//! every [`heartbeat interval`](Heartbeat::interval)), and each receive waits at most the
//! bootstrap timeout (`MSCCLPP_BOOTSTRAP_TIMEOUT`, default 30 s). A rank 0 that is stuck
//! (one step or the setup longer than that timeout) or gone ends the wait with an error
//! naming it; a rank 0 whose baseline fails says so before it exits. The last message
//! carries the baseline's samples/s, so every rank knows it.

use std::time::{Duration, Instant};

use mscclpp::host::collectives::Collectives;

use crate::config::Config;
use crate::report::{Recorder, RunReport};
use crate::{Error, Ranks};

/// Bootstrap tag of the baseline's messages ("TRDPBASE"; the communicator's own tags
/// start with "MSCP" / "MSCA").
const TAG: u64 = 0x5452_4450_4241_5345;

/// Message kinds, the first byte of every message.
const ALIVE: u8 = 0;
const DONE: u8 = 1;
const FAILED: u8 = 2;

/// Faults the integration tests inject (`TRAIN_DP_FAULT`) into rank 0's baseline, to show
/// that the wait is bounded and kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `baseline-stall`: rank 0 sleeps twice the bootstrap timeout before training, without
    /// heartbeats (the waiting ranks must time out).
    Stall,
    /// `baseline-slow`: 200 ms of sleep between the baseline's steps (heartbeats go on: a
    /// baseline longer than the bootstrap timeout must still succeed).
    Slow,
    /// `baseline-fail`: rank 0's baseline fails at once (the waiting ranks must be told).
    Fail,
}

fn fault() -> Option<Fault> {
    match std::env::var("TRAIN_DP_FAULT").as_deref() {
        Ok("baseline-stall") => Some(Fault::Stall),
        Ok("baseline-slow") => Some(Fault::Slow),
        Ok("baseline-fail") => Some(Fault::Fail),
        _ => None,
    }
}

/// How a training run is carried out on this rank.
#[derive(Debug)]
pub enum Mode<'a> {
    /// Every rank trains (the real run); `baseline`: the 1-rank samples/s, when measured.
    Together {
        /// Samples/s of the `--baseline` run.
        baseline: Option<f64>,
    },
    /// Rank 0 trains alone (`--baseline`), keeping the waiting ranks informed.
    Alone(Heartbeat<'a>),
}

impl Mode<'_> {
    /// The label of the run's lines and report: `baseline` alone, else `together`.
    pub fn label<'s>(&self, together: &'s str) -> &'s str {
        match self {
            Mode::Alone(_) => "baseline",
            Mode::Together { .. } => together,
        }
    }

    /// A recorder for a run of `nranks` ranks.
    pub fn recorder(&self, nranks: usize) -> Recorder {
        match self {
            Mode::Together { baseline } => Recorder::new(*baseline, nranks),
            Mode::Alone(_) => Recorder::default(),
        }
    }

    /// Between steps: alone, tells the waiting ranks that rank 0 is alive (when the last
    /// heartbeat is older than the interval).
    pub fn between_steps(&mut self) -> Result<(), Error> {
        match self {
            Mode::Alone(h) => {
                if fault() == Some(Fault::Slow) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                h.beat()
            }
            Mode::Together { .. } => Ok(()),
        }
    }
}

/// Rank 0's side of the wait: messages to every other rank.
#[derive(Debug)]
pub struct Heartbeat<'a> {
    coll: &'a Collectives,
    last: Instant,
    interval: Duration,
}

impl<'a> Heartbeat<'a> {
    fn new(coll: &'a Collectives) -> Heartbeat<'a> {
        let timeout = coll.communicator().bootstrap().as_async().config().timeout;
        Heartbeat {
            coll,
            last: Instant::now(),
            interval: Self::interval(timeout),
        }
    }

    /// A quarter of the bootstrap timeout, at most a second.
    pub fn interval(timeout: Duration) -> Duration {
        (timeout / 4).min(Duration::from_secs(1))
    }

    fn send(&mut self, kind: u8, value: f64) -> Result<(), Error> {
        let mut msg = vec![kind];
        msg.extend_from_slice(&value.to_le_bytes());
        let bs = self.coll.communicator().bootstrap();
        for peer in 1..bs.nranks() {
            bs.send_named(peer, TAG, "the --baseline heartbeat", &msg)?;
        }
        self.last = Instant::now();
        Ok(())
    }

    fn beat(&mut self) -> Result<(), Error> {
        if self.last.elapsed() >= self.interval {
            self.send(ALIVE, 0.0)?;
        }
        Ok(())
    }
}

/// The outcome of `--baseline` on this rank.
#[derive(Debug)]
pub struct Baseline {
    /// Samples/s of rank 0 training alone (every rank knows it).
    pub samples_per_s: f64,
    /// The baseline run's report (rank 0 only).
    pub report: Option<RunReport>,
}

/// Runs the baseline: on rank 0, `train` with the 1-rank configuration, a 1-rank view of
/// the ranks and [`Mode::Alone`]; the other ranks wait for it (bounded, see the module
/// docs). Every rank of the job must call it.
pub fn run(
    cfg: &Config,
    coll: &Collectives,
    ranks: &Ranks,
    train: impl FnOnce(&Config, &Ranks, &mut Mode<'_>) -> Result<RunReport, Error>,
) -> Result<Baseline, Error> {
    if ranks.rank != 0 {
        return wait(coll);
    }
    let solo = cfg.solo();
    println!(
        "baseline: rank 0 trains alone first (same model, {} samples per step as every rank, {} steps, no all-reduce){}",
        solo.batch,
        solo.steps,
        match ranks.nranks {
            1 => String::new(),
            2 => "; rank 1 waits".into(),
            n => format!("; ranks 1-{} wait", n - 1),
        }
    );
    let mut mode = Mode::Alone(Heartbeat::new(coll));
    let one = Ranks { rank: 0, nranks: 1 };
    let result = match fault() {
        Some(Fault::Fail) => Err("injected failure (TRAIN_DP_FAULT=baseline-fail)".into()),
        f => {
            if f == Some(Fault::Stall) {
                let timeout = coll.communicator().bootstrap().as_async().config().timeout;
                std::thread::sleep(2 * timeout);
            }
            train(&solo, &one, &mut mode)
        }
    };
    let Mode::Alone(mut heart) = mode else {
        unreachable!("the mode stays Alone")
    };
    match result {
        Ok(report) => {
            let sps = report.summary.samples_per_s;
            if !(sps.is_finite() && sps > 0.0) {
                let _ = heart.send(FAILED, 0.0);
                return Err(format!("the baseline measured {sps} samples/s").into());
            }
            heart.send(DONE, sps)?;
            Ok(Baseline {
                samples_per_s: sps,
                report: Some(report),
            })
        }
        Err(e) => {
            // Best effort: the others also see rank 0 leave.
            let _ = heart.send(FAILED, 0.0);
            Err(format!("--baseline (rank 0 alone): {e}").into())
        }
    }
}

/// A rank other than 0: receives rank 0's heartbeats until its result.
fn wait(coll: &Collectives) -> Result<Baseline, Error> {
    let bs = coll.communicator().bootstrap();
    loop {
        let msg = bs
            .recv_named(0, TAG, "the --baseline heartbeat")
            .map_err(|e| {
                format!(
                    "waiting for rank 0's --baseline run: {e} (a step or the setup longer than the bootstrap timeout? raise MSCCLPP_BOOTSTRAP_TIMEOUT)"
                )
            })?;
        let (kind, value) = match msg.as_slice() {
            [k, v @ ..] if v.len() == 8 => (*k, f64::from_le_bytes(v.try_into().unwrap_or([0; 8]))),
            _ => return Err(format!("bad --baseline message of {} bytes", msg.len()).into()),
        };
        match kind {
            ALIVE => {}
            DONE => {
                return Ok(Baseline {
                    samples_per_s: value,
                    report: None,
                });
            }
            FAILED => return Err("rank 0's --baseline run failed (see its error)".into()),
            k => return Err(format!("bad --baseline message kind {k}").into()),
        }
    }
}
