//! Garbage and truncated input: decoders must return errors, never panic.

use super::samples::*;
use crate::*;

type Decoder = fn(&[u8]) -> Result<(), ProtocolError>;

/// Every decoder, each with a valid input and the prefix lengths that are themselves valid
/// (an optional trailing field).
fn decoders() -> Vec<(&'static str, Decoder, Vec<u8>, &'static [usize])> {
    vec![
        ("header", |b| Header::decode(b).map(drop), generic_ok(), &[]),
        (
            "advertise",
            |b| Advertise::decode(b).map(drop),
            advertise(),
            &[],
        ),
        (
            "process info v1",
            |b| ProcessInfo::decode_v1(b).map(drop),
            PROCESS_INFO_V1.to_vec(),
            &[],
        ),
        (
            "process info v2",
            |b| ProcessInfo::decode_v2(b).map(drop),
            PROCESS_INFO_V2.to_vec(),
            &[],
        ),
        (
            "process info v3",
            |b| ProcessInfo::decode_v3(b).map(drop),
            PROCESS_INFO_V3.to_vec(),
            &[],
        ),
        (
            "session id",
            |b| decode_session_id(b).map(drop),
            SESSION_ID.to_vec(),
            &[],
        ),
        // ResumeRuntime's reply may have no payload at all.
        (
            "status",
            |b| decode_status(b).map(drop),
            STATUS_OK.to_vec(),
            &[0],
        ),
        (
            "error",
            |b| decode_error(b).map(drop),
            ERROR_BAD_ENCODING.to_vec(),
            &[],
        ),
        // The message after the HRESULT is optional.
        (
            "dump3 error",
            |b| decode_error(b).map(drop),
            ERROR_DUMP3.to_vec(),
            &[4],
        ),
        (
            "environment header",
            |b| EnvironmentHeader::decode(b).map(drop),
            ENV_HEADER.to_vec(),
            &[],
        ),
        (
            "environment",
            |b| decode_environment(b).map(drop),
            ENV_BLOCK.to_vec(),
            &[],
        ),
    ]
}

fn generic_ok() -> Vec<u8> {
    [&MAGIC[..], &[0x14, 0x00, 0xFF, 0x00, 0x00, 0x00]].concat()
}

fn advertise() -> Vec<u8> {
    [
        &b"ADVR_V1\0"[..],
        &COOKIE,
        &[0x39, 0x30, 0, 0, 0, 0, 0, 0],
        &[0, 0],
    ]
    .concat()
}

#[test]
fn valid_samples_decode() {
    for (name, decode, valid, _) in decoders() {
        assert!(decode(&valid).is_ok(), "{name}: {:?}", decode(&valid));
    }
}

#[test]
fn every_truncation_is_an_error() {
    for (name, decode, valid, valid_prefixes) in decoders() {
        for n in 0..valid.len() {
            let r = decode(&valid[..n]);
            if valid_prefixes.contains(&n) {
                assert!(
                    r.is_ok(),
                    "{name}: prefix of {n} bytes should decode: {r:?}"
                );
            } else {
                assert!(r.is_err(), "{name}: prefix of {n} bytes decoded");
            }
        }
    }
}

/// xorshift64: deterministic, dependency-free randomness for the loops below.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let decoders = decoders();
    let mut buf = Vec::new();
    for _ in 0..20_000 {
        buf.clear();
        let len = rng.below(160);
        // Small values are likelier to form plausible counts, so bias towards them.
        let small = rng.below(2) == 0;
        buf.extend((0..len).map(|_| {
            if small {
                (rng.next() % 4) as u8
            } else {
                rng.next() as u8
            }
        }));
        for (_, decode, _, _) in &decoders {
            let _ = decode(&buf);
        }
    }
}

#[test]
fn mutated_valid_messages_never_panic() {
    let mut rng = XorShift(0xD1B5_4A32_D192_ED03);
    for (_, decode, valid, _) in decoders() {
        for _ in 0..5_000 {
            let mut m = valid.clone();
            for _ in 0..=rng.below(4) {
                let i = rng.below(m.len());
                match rng.below(3) {
                    0 => m[i] = rng.next() as u8,
                    1 => m[i] ^= 1 << rng.below(8),
                    _ => m.truncate(i),
                }
                if m.is_empty() {
                    break;
                }
            }
            let _ = decode(&m);
        }
    }
}

/// Every request encodes into a message whose header decodes back and states its real length.
#[test]
fn encoded_requests_have_consistent_headers() {
    let requests = [
        Request::ProcessInfo,
        Request::SetEnvironmentVariable {
            name: "A".into(),
            value: String::new(),
        },
        Request::CollectTracing(CollectTracing::v2(vec![ProviderConfig::new("P", 1, 5)])),
        Request::GenerateCoreDump(CoreDump::new("/tmp/x", DumpType::Normal)),
    ];
    for req in requests {
        let bytes = req.encode().unwrap();
        let h = Header::decode(&bytes).unwrap();
        assert_eq!(usize::from(h.size), bytes.len());
        assert_eq!((h.command_set, h.command_id), req.command());
    }
}
