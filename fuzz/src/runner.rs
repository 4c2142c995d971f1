//! The runner: each input decoded under `catch_unwind`, a panic counted and its input
//! kept as a regression case, the process's resident memory read before, during and
//! after, and the time per input.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::rng::Rng;
use sha2::{Digest, Sha256};

/// One decoder under fuzzing, with what state it keeps between inputs (a Sparkplug
/// session, an agent's seen commands).
pub trait Target {
    /// The input generator's next input, from the seeds, structural or byte-level.
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8>;
    /// Decodes one input: `true` when the decoder took it, `false` when it refused it
    /// with an error (the clear refusal every bad input must get).
    fn decode(&mut self, input: &[u8]) -> bool;
}

/// A decoder by name, and how to make a fresh one.
#[derive(Clone, Copy)]
pub struct Decoder {
    pub name: &'static str,
    pub make: fn() -> Box<dyn Target>,
}

/// What a run of one decoder gave.
#[derive(Debug, Clone)]
pub struct Report {
    pub name: &'static str,
    pub seed: u64,
    pub inputs: u64,
    pub panics: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub elapsed: Duration,
    pub slowest: Duration,
    /// Resident memory after the run less before it, and the most it grew meanwhile.
    pub rss_growth: i64,
    pub rss_peak_growth: i64,
    /// The panics' inputs, as written, and their messages.
    pub saved: Vec<(PathBuf, String)>,
}

impl Report {
    pub fn header() -> String {
        format!(
            "| {:<12} | {:>9} | {:>6} | {:>9} | {:>9} | {:>9} | {:>10} | {:>11} | {:>13} |",
            "decoder",
            "inputs",
            "panics",
            "accepted",
            "rejected",
            "inputs/s",
            "slowest ms",
            "RSS growth",
            "RSS peak gr."
        ) + "\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    }

    pub fn row(&self) -> String {
        let rate = self.inputs as f64 / self.elapsed.as_secs_f64().max(1e-9);
        let mib = |b: i64| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0));
        format!(
            "| {:<12} | {:>9} | {:>6} | {:>9} | {:>9} | {:>9.0} | {:>10.2} | {:>11} | {:>13} |",
            self.name,
            self.inputs,
            self.panics,
            self.accepted,
            self.rejected,
            rate,
            self.slowest.as_secs_f64() * 1e3,
            mib(self.rss_growth),
            mib(self.rss_peak_growth)
        )
    }
}

/// Resident memory of this process in bytes (`/proc/self/statm`; 0 where there is none).
pub fn rss_bytes() -> i64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<i64>().ok())
        .map_or(0, |pages| pages * 4096)
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic hook that, on a thread decoding fuzzed input, records the message instead
/// of printing it; other threads' panics (a failing test's) go to the hook before it.
fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                LAST.with(|l| *l.borrow_mut() = Some(info.to_string()));
            } else {
                before(info);
            }
        }));
    });
}

/// Decodes `input` under `catch_unwind`: `Ok(taken)`, or the panic's message.
pub fn guarded(target: &mut dyn Target, input: &[u8]) -> Result<bool, String> {
    install_hook();
    QUIET.with(|q| q.set(true));
    let r = catch_unwind(AssertUnwindSafe(|| target.decode(input)));
    QUIET.with(|q| q.set(false));
    r.map_err(|_| {
        LAST.with(|l| l.borrow_mut().take())
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// Where a decoder's regression cases are kept: `regressions/<decoder>/`.
pub fn regression_dir(root: &Path, name: &str) -> PathBuf {
    root.join(name)
}

/// Inputs a stateful decoder (a Sparkplug session, an agent) saw before a panic that
/// are kept to replay it: at most so many.
const HISTORY: usize = 1024;

/// `inputs` as one case: each as a 4-byte little-endian length and its bytes.
fn encode(inputs: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for i in inputs {
        out.extend_from_slice(&(i.len() as u32).to_le_bytes());
        out.extend_from_slice(i);
    }
    out
}

/// The inputs of a case, in order (a torn tail is dropped).
pub fn decode_case(mut b: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if b.len() - 4 < n {
            break;
        }
        out.push(&b[4..4 + n]);
        b = &b[4 + n..];
    }
    out
}

/// Whether `inputs`, decoded in order by a fresh `d`, panic; the message.
fn panics(d: Decoder, inputs: &[&[u8]]) -> Option<String> {
    let mut target = (d.make)();
    inputs
        .iter()
        .find_map(|i| guarded(target.as_mut(), i).err())
}

/// The shortest tail of `history` (the panicking input last) that still panics on a
/// fresh target, written as `<sha256 prefix>.bin`; its path.
fn keep(root: &Path, d: Decoder, history: &[&[u8]]) -> PathBuf {
    let mut k = 1;
    let tail = loop {
        let tail = &history[history.len().saturating_sub(k)..];
        if k >= history.len() || panics(d, tail).is_some() {
            break tail;
        }
        k *= 2;
    };
    let case = encode(tail);
    let dir = regression_dir(root, d.name);
    let _ = std::fs::create_dir_all(&dir);
    let hash = hex::encode(Sha256::digest(&case));
    let path = dir.join(format!("{}.bin", &hash[..16]));
    if let Err(e) = std::fs::write(&path, &case) {
        eprintln!("could not keep {}: {e}", path.display());
    }
    path
}

/// Runs `count` generated inputs through a fresh `d`, seeded with `seed`; a panicking
/// input is written under `regressions` with the inputs before it that the panic
/// needs (a panicked target is made afresh).
pub fn run(d: Decoder, count: u64, seed: u64, regressions: &Path) -> Report {
    let mut rng = Rng::new(seed);
    let mut target = (d.make)();
    let mut r = Report {
        name: d.name,
        seed,
        inputs: 0,
        panics: 0,
        accepted: 0,
        rejected: 0,
        elapsed: Duration::ZERO,
        slowest: Duration::ZERO,
        rss_growth: 0,
        rss_peak_growth: 0,
        saved: Vec::new(),
    };
    let mut history: std::collections::VecDeque<Vec<u8>> = std::collections::VecDeque::new();
    let before = rss_bytes();
    let started = Instant::now();
    for n in 0..count {
        let input = target.generate(&mut rng);
        let t = Instant::now();
        let outcome = guarded(target.as_mut(), &input);
        r.slowest = r.slowest.max(t.elapsed());
        r.inputs += 1;
        match outcome {
            Ok(true) => r.accepted += 1,
            Ok(false) => r.rejected += 1,
            Err(message) => {
                r.panics += 1;
                if r.saved.len() < 20 {
                    let mut seen: Vec<&[u8]> = history.iter().map(Vec::as_slice).collect();
                    seen.push(&input);
                    r.saved.push((keep(regressions, d, &seen), message));
                }
                history.clear();
                target = (d.make)();
                continue;
            }
        }
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(input);
        if n % 1024 == 0 {
            r.rss_peak_growth = r.rss_peak_growth.max(rss_bytes() - before);
        }
    }
    r.elapsed = started.elapsed();
    r.rss_growth = rss_bytes() - before;
    r.rss_peak_growth = r.rss_peak_growth.max(r.rss_growth);
    r
}

/// Replays every kept case of `d` (its inputs in order) through a fresh target each;
/// the panics' files and messages.
pub fn replay(d: Decoder, regressions: &Path) -> (usize, Vec<(PathBuf, String)>) {
    let dir = regression_dir(regressions, d.name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    let mut failed = Vec::new();
    let mut n = 0;
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "bin"))
    {
        let Ok(input) = std::fs::read(f) else {
            continue;
        };
        n += 1;
        if let Some(m) = panics(d, &decode_case(&input)) {
            failed.push((f.clone(), m));
        }
    }
    (n, failed)
}
