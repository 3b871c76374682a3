//! How fast the machine is right now, from three fixed pieces of work timed in a fraction of a
//! second, so a benchmark figure can be read against the state of the machine it ran on.
//!
//! Why it exists: this project's machines are 2-core VMs shared with other work, and the same
//! build measures up to twice as fast in one half hour as in the next (BENCHMARKS.md: the same
//! binary's OTLP ingest 60,000 spans/s in one phase and 120,000 in another). A figure alone
//! cannot tell a slower build from a slower machine; these probes can, because their work never
//! changes:
//! - `aluNs`: one step of a multiply-xorshift chain (pure CPU: frequency and steal);
//! - `memoryNs`: one dependent load at a random place in 64 MiB (cache and memory bandwidth
//!   shared with neighbours);
//! - `wakeUs`: one round trip of a byte between two threads over two pipes, each side blocked
//!   in `read` until the other writes (a system call and a cross-thread wake-up, the cost that
//!   dominates a request handed from a connection task to the store's writer thread and back).
//!
//! Each is the best of three short rounds, so a single hiccup does not count; the whole probe
//! takes about half a second.

use std::hint::black_box;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Rounds per probe (the best counts).
const ROUNDS: usize = 3;

/// How much work each probe's round does.
#[derive(Debug, Clone, Copy)]
struct ProbeSize {
    /// Steps of the CPU chain.
    alu_steps: u64,
    /// Elements (`u32`) of the memory chase.
    memory_elements: usize,
    /// Dependent loads.
    memory_loads: usize,
    /// Thread round trips.
    wake_round_trips: usize,
}

impl ProbeSize {
    /// What `measure` runs: 64 MiB for the chase, past any last-level cache of this machine
    /// class; about half a second in all.
    const FULL: Self = Self {
        alu_steps: 20_000_000,
        memory_elements: 16 << 20,
        memory_loads: 2_000_000,
        wake_round_trips: 5_000,
    };
}

/// The three probes' results.
#[derive(Debug, Clone, Copy)]
pub struct MachineSpeed {
    pub alu_ns: f64,
    pub memory_ns: f64,
    /// `None` when the pipes or the thread could not be made.
    pub wake_us: Option<f64>,
}

impl MachineSpeed {
    pub fn to_json(self) -> Value {
        json!({
            "aluNs": round3(self.alu_ns),
            "memoryNs": round3(self.memory_ns),
            "wakeUs": self.wake_us.map(round3),
        })
    }

    /// One line for people.
    pub fn describe(self) -> String {
        let wake = match self.wake_us {
            Some(us) => format!("{us:.1} us"),
            None => "unmeasured".to_string(),
        };
        format!(
            "machine now: {:.2} ns a CPU step, {:.1} ns a random memory load, {wake} a \
             cross-thread wake-up round trip (best of {ROUNDS}; lower is faster)",
            self.alu_ns, self.memory_ns
        )
    }
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Run the three probes (about half a second, on the calling thread plus one helper thread).
pub fn measure() -> MachineSpeed {
    measure_with(ProbeSize::FULL)
}

fn measure_with(size: ProbeSize) -> MachineSpeed {
    MachineSpeed {
        alu_ns: best_of(|| alu_round(size.alu_steps).as_secs_f64() * 1e9 / size.alu_steps as f64),
        memory_ns: memory_probe(size.memory_elements, size.memory_loads),
        wake_us: wake_probe(size.wake_round_trips),
    }
}

fn best_of(mut round: impl FnMut() -> f64) -> f64 {
    (0..ROUNDS).map(|_| round()).fold(f64::INFINITY, f64::min)
}

fn alu_round(steps: u64) -> Duration {
    let started = Instant::now();
    let mut state: u64 = black_box(0x9E37_79B9_7F4A_7C15);
    for _ in 0..steps {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
    }
    black_box(state);
    started.elapsed()
}

/// A single cycle through all elements in random order (Sattolo's shuffle), so every load
/// depends on the one before and the prefetcher cannot guess the next.
fn memory_probe(elements: usize, loads: usize) -> f64 {
    let mut next: Vec<u32> = (0..u32::try_from(elements).unwrap_or(u32::MAX)).collect();
    let mut random: u64 = 0x2545_F491_4F6C_DD1D;
    for index in (1..next.len()).rev() {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        let other = (random % index as u64) as usize;
        next.swap(index, other);
    }
    best_of(|| {
        let started = Instant::now();
        let mut at = black_box(0usize);
        for _ in 0..loads {
            at = next.get(at).map_or(0, |&to| to as usize);
        }
        black_box(at);
        started.elapsed().as_secs_f64() * 1e9 / loads as f64
    })
}

fn wake_probe(round_trips: usize) -> Option<f64> {
    let (echo_in, mut to_echo) = std::io::pipe().ok()?;
    let (mut from_echo, echo_out) = std::io::pipe().ok()?;
    let echo = std::thread::Builder::new()
        .name("machine-probe".into())
        .spawn(move || {
            let (mut input, mut output) = (echo_in, echo_out);
            let mut byte = [0u8; 1];
            while input.read_exact(&mut byte).is_ok() {
                if output.write_all(&byte).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    let mut byte = [0u8; 1];
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..round_trips {
            to_echo.write_all(&byte).ok()?;
            from_echo.read_exact(&mut byte).ok()?;
        }
        best = best.min(started.elapsed().as_secs_f64() * 1e6 / round_trips as f64);
    }
    drop(to_echo);
    let _ = echo.join();
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_probe_measures_a_positive_finite_time() {
        // The same code as `measure`, on a small scale (tests run unoptimized).
        let speed = measure_with(ProbeSize {
            alu_steps: 100_000,
            memory_elements: 1 << 16,
            memory_loads: 100_000,
            wake_round_trips: 200,
        });
        assert!(speed.alu_ns.is_finite() && speed.alu_ns > 0.0, "{speed:?}");
        assert!(
            speed.memory_ns.is_finite() && speed.memory_ns > 0.0,
            "{speed:?}"
        );
        let wake = speed.wake_us.expect("pipes and a thread can be made");
        assert!(wake.is_finite() && wake > 0.0, "{speed:?}");
        assert!(speed.describe().starts_with("machine now: "));
        assert!(speed.to_json()["wakeUs"].is_number());
    }
}
