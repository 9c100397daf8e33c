//! Random event sequences checked against a naive model that tracks the owner of every address.
//! Deterministic: a fixed-seed PRNG, so a failure reproduces; the seed and step are printed.

use std::collections::HashMap;

use symbolizer::{
    CodeMap, FrameKind, LoadSource, MethodFlags, MethodLoad, MethodUnload, OptimizationTier,
};

/// SplitMix64: tiny, good enough to drive a test, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const BASE: u64 = 0x1000;
const SPACE: usize = 1024;
const TIERS: [u32; 4] = [0x180, 0x200, 0x280, 0x300];

#[derive(Clone, Debug)]
struct ModelCode {
    namespace: String,
    tier: OptimizationTier,
    identity: (u64, u64, u64),
    start: usize,
    end: usize,
    rank: (u64, u64),
    unloaded_at: Option<u64>,
}

/// The reference: an owner per address, painted by rank, exactly as documented on `CodeMap`.
#[derive(Default)]
struct Model {
    codes: Vec<Option<ModelCode>>,
    index: HashMap<(u64, u64, u64), usize>,
    owner: Vec<Option<usize>>,
    seq: u64,
}

impl Model {
    fn new() -> Self {
        Self {
            owner: vec![None; SPACE],
            ..Self::default()
        }
    }

    fn rank(&self, c: usize) -> (u64, u64) {
        self.codes[c].as_ref().map_or((0, 0), |code| code.rank)
    }

    fn unpaint(&mut self, c: usize) {
        for slot in &mut self.owner {
            if *slot == Some(c) {
                *slot = None;
            }
        }
    }

    fn paint(&mut self, c: usize) {
        let (start, end, rank) = {
            let code = self.codes[c].as_ref().unwrap();
            (code.start, code.end, code.rank)
        };
        for a in start..end.min(SPACE) {
            let take = match self.owner[a] {
                None => true,
                Some(o) => o != c && self.rank(o) < rank,
            };
            if take {
                self.owner[a] = Some(c);
            }
        }
    }

    fn free_empty(&mut self) {
        for c in 0..self.codes.len() {
            if self.codes[c].is_some() && !self.owner.contains(&Some(c)) {
                self.free(c);
            }
        }
    }

    fn free(&mut self, c: usize) {
        if let Some(code) = self.codes[c].take() {
            if self.index.get(&code.identity) == Some(&c) {
                self.index.remove(&code.identity);
            }
        }
    }

    fn load(&mut self, e: &MethodLoad) {
        self.seq += 1;
        let rank = (e.timestamp, self.seq);
        let tier = OptimizationTier::from_method_flags(e.flags);
        let identity = (e.method_id, e.start_address, e.rejit_id);
        let start = (e.start_address - BASE) as usize;
        let end = start + e.size as usize;
        let existing = self
            .index
            .get(&identity)
            .copied()
            .filter(|&c| self.codes[c].as_ref().unwrap().namespace == e.namespace);
        let c = match existing {
            Some(c) => {
                self.unpaint(c);
                let code = self.codes[c].as_mut().unwrap();
                code.rank = code.rank.max(rank);
                code.end = end;
                code.tier = tier;
                if code.unloaded_at.is_some_and(|t| t <= e.timestamp) {
                    code.unloaded_at = None;
                }
                c
            }
            None => {
                self.codes.push(Some(ModelCode {
                    namespace: e.namespace.clone(),
                    tier,
                    identity,
                    start,
                    end,
                    rank,
                    unloaded_at: None,
                }));
                let c = self.codes.len() - 1;
                self.index.insert(identity, c);
                c
            }
        };
        self.paint(c);
        self.free_empty();
    }

    fn unload(&mut self, u: &MethodUnload) {
        let identity = (u.method_id, u.start_address, u.rejit_id);
        if let Some(&c) = self.index.get(&identity) {
            let code = self.codes[c].as_mut().unwrap();
            if code.rank.0 <= u.timestamp {
                code.unloaded_at = Some(u.timestamp);
            }
        }
    }

    fn prune(&mut self, before: u64) {
        for c in 0..self.codes.len() {
            let doomed = self.codes[c]
                .as_ref()
                .is_some_and(|code| code.unloaded_at.is_some_and(|t| t < before));
            if doomed {
                self.unpaint(c);
                self.free(c);
            }
        }
    }

    fn expect(&self, a: usize) -> Option<(String, OptimizationTier)> {
        self.owner[a].map(|c| {
            let code = self.codes[c].as_ref().unwrap();
            (code.namespace.clone(), code.tier)
        })
    }

    fn live_codes(&self) -> usize {
        self.codes.iter().flatten().count()
    }

    fn runs(&self) -> usize {
        let mut runs = 0;
        let mut previous = None;
        for &owner in &self.owner {
            if owner.is_some() && owner != previous {
                runs += 1;
            }
            previous = owner;
        }
        runs
    }
}

fn check(map: &CodeMap, model: &Model, seed: u64, step: usize) {
    for a in 0..SPACE {
        let frame = map.symbolize(BASE + a as u64);
        let got = match frame.kind {
            FrameKind::Managed { tier, .. } => {
                Some((map.function(frame.function).namespace().to_string(), tier))
            }
            _ => None,
        };
        assert_eq!(
            got,
            model.expect(a),
            "seed {seed} step {step} address {:#x}",
            BASE + a as u64
        );
    }
    let stats = map.stats();
    assert_eq!(
        stats.code_versions,
        model.live_codes(),
        "seed {seed} step {step}"
    );
    assert_eq!(
        stats.segments,
        model.runs(),
        "seed {seed} step {step}: segments stay coalesced"
    );
}

fn run(seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let mut map = CodeMap::new();
    let mut model = Model::new();
    let mut loaded: Vec<MethodLoad> = Vec::new();
    for step in 0..steps {
        match rng.below(10) {
            0..=5 => {
                let method_id = 1 + rng.below(6);
                // Sometimes the same method id names another method (reuse after unload).
                let variant = u64::from(rng.below(8) == 0);
                let start = BASE + rng.below(SPACE as u64 - 1);
                let max = (BASE + SPACE as u64 - start).min(160);
                let event = MethodLoad {
                    method_id,
                    module_id: 1,
                    start_address: start,
                    size: 1 + rng.below(max) as u32,
                    method_token: 0x0600_0000 + method_id as u32,
                    flags: MethodFlags::JITTED | TIERS[rng.below(4) as usize],
                    namespace: format!("N{method_id}v{variant}"),
                    name: "M".to_string(),
                    signature: "void  ()".to_string(),
                    rejit_id: rng.below(3),
                    timestamp: rng.below(100),
                    source: if rng.below(2) == 0 {
                        LoadSource::Live
                    } else {
                        LoadSource::Rundown
                    },
                };
                map.load_method(&event).expect("valid event");
                model.load(&event);
                loaded.push(event);
            }
            6 if !loaded.is_empty() => {
                // Re-report a known code version (rundown), maybe with a new size.
                let mut event = loaded[rng.below(loaded.len() as u64) as usize].clone();
                event.timestamp = rng.below(120);
                if rng.below(3) == 0 {
                    let max = (BASE + SPACE as u64 - event.start_address).min(160);
                    event.size = 1 + rng.below(max) as u32;
                }
                map.load_method(&event).expect("valid event");
                model.load(&event);
            }
            7 | 8 if !loaded.is_empty() => {
                let event = &loaded[rng.below(loaded.len() as u64) as usize];
                let unload = MethodUnload {
                    method_id: event.method_id,
                    start_address: event.start_address,
                    size: event.size,
                    rejit_id: event.rejit_id,
                    timestamp: rng.below(120),
                };
                map.unload_method(&unload);
                model.unload(&unload);
            }
            _ => {
                let before = rng.below(120);
                map.prune_unloaded(before);
                model.prune(before);
            }
        }
        check(&map, &model, seed, step);
    }
}

#[test]
fn random_sequences_match_the_model() {
    for seed in 0..24 {
        run(seed, 150);
    }
}
