//! Bad files get a typed error that names what is wrong; no byte pattern makes the reader
//! panic or allocate absurdly.

mod common;

use common::sample_file;
use redlite_gguf::{GgufError, GgufFile};

/// Builds a header by hand, field by field.
#[derive(Default)]
struct Bytes(Vec<u8>);

impl Bytes {
    fn gguf(version: u32, tensors: u64, kvs: u64) -> Bytes {
        let mut b = Bytes::default();
        b.raw(b"GGUF").u32(version).u64(tensors).u64(kvs);
        b
    }
    fn raw(&mut self, x: &[u8]) -> &mut Self {
        self.0.extend_from_slice(x);
        self
    }
    fn u32(&mut self, x: u32) -> &mut Self {
        self.raw(&x.to_le_bytes())
    }
    fn u64(&mut self, x: u64) -> &mut Self {
        self.raw(&x.to_le_bytes())
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
    /// A tensor entry with GGUF (fastest-first) dimensions.
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> Vec<u8> {
        while !self.0.len().is_multiple_of(32) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0u8, n));
        self.0.clone()
    }
}

fn err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("a bad file was accepted"),
        Err(e) => e,
    }
}

#[test]
fn bad_magic_and_version() {
    let e = err(b"GGML\x03\0\0\0".to_vec());
    assert!(matches!(e, GgufError::BadMagic { found, .. } if &found == b"GGML"));
    for v in [1, 4] {
        let e = err(Bytes::gguf(v, 0, 0).data(0));
        assert!(
            matches!(e, GgufError::UnsupportedVersion { found, .. } if found == v),
            "{e}"
        );
    }
    // Version 2 and 3 are both read.
    assert!(GgufFile::from_bytes(Bytes::gguf(2, 0, 0).data(0)).is_ok());
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let e = err(Bytes::gguf(3, 1 << 60, 0).data(0));
    assert!(
        matches!(e, GgufError::CountTooLarge { count, .. } if count == 1 << 60),
        "{e}"
    );
    let e = err(Bytes::gguf(3, 0, u64::MAX).data(0));
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    // A string claiming 2^62 bytes.
    let mut b = Bytes::gguf(3, 0, 1);
    b.u64(1 << 62);
    let e = err(b.data(64));
    assert!(e.to_string().contains("metadata key #0"), "{e}");
    // An array claiming 2^60 strings.
    let mut b = Bytes::gguf(3, 0, 1);
    b.str("tokens").u32(9).u32(8).u64(1 << 60);
    let e = err(b.data(64));
    assert!(e.to_string().contains("\"tokens\""), "{e}");
}

#[test]
fn unknown_types_are_named() {
    let mut b = Bytes::gguf(3, 0, 1);
    b.str("weird").u32(13).u32(0);
    let e = err(b.data(0));
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, found: 13, .. } if key == "weird"),
        "{e}"
    );

    let mut b = Bytes::gguf(3, 1, 0);
    b.tensor("blk.0.x", &[32], 99, 0);
    let e = err(b.data(64));
    assert!(
        matches!(&e, GgufError::UnknownTensorType { tensor, found: 99, .. } if tensor == "blk.0.x"),
        "{e}"
    );
}

#[test]
fn bad_tensor_entries() {
    // Row of 100 values is not a whole number of Q4_K blocks (256).
    let mut b = Bytes::gguf(3, 1, 0);
    b.tensor("w", &[100, 2], 12, 0);
    let e = err(b.data(1024));
    assert!(
        matches!(
            &e,
            GgufError::RowNotBlockAligned {
                row: 100,
                block: 256,
                ..
            }
        ),
        "{e}"
    );

    // Dimension counts 0 and 5.
    for dims in [&[][..], &[1, 1, 1, 1, 1][..]] {
        let mut b = Bytes::gguf(3, 1, 0);
        b.tensor("w", dims, 0, 0);
        assert!(matches!(
            err(b.data(64)),
            GgufError::BadDimensionCount { .. }
        ));
    }

    // Misaligned offset.
    let mut b = Bytes::gguf(3, 1, 0);
    b.tensor("w", &[4], 0, 8);
    assert!(matches!(
        err(b.data(64)),
        GgufError::MisalignedTensor { offset: 8, .. }
    ));

    // Data past the end: 16 F32 need 64 bytes, 32 are there.
    let mut b = Bytes::gguf(3, 1, 0);
    b.tensor("w", &[16], 0, 0);
    let e = err(b.data(32));
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { tensor, end: 64, data_len: 32, .. } if tensor == "w"),
        "{e}"
    );

    // Overlap.
    let mut b = Bytes::gguf(3, 2, 0);
    b.tensor("a", &[16], 0, 0).tensor("b", &[16], 0, 32);
    let e = err(b.data(128));
    assert!(
        matches!(&e, GgufError::TensorsOverlap { first, second, .. } if first == "a" && second == "b"),
        "{e}"
    );

    // Size overflow.
    let mut b = Bytes::gguf(3, 1, 0);
    b.tensor("w", &[1 << 40, 1 << 40], 0, 0);
    assert!(matches!(err(b.data(32)), GgufError::ShapeOverflow { .. }));

    // Duplicate name.
    let mut b = Bytes::gguf(3, 2, 0);
    b.tensor("a", &[8], 0, 0).tensor("a", &[8], 0, 32);
    assert!(matches!(err(b.data(64)), GgufError::DuplicateTensor { .. }));
}

#[test]
fn bad_metadata() {
    let mut b = Bytes::gguf(3, 0, 1);
    b.u64(2).raw(&[0xff, 0xfe]).u32(4).u32(1);
    assert!(matches!(err(b.data(0)), GgufError::BadUtf8 { .. }));

    let mut b = Bytes::gguf(3, 0, 2);
    b.str("k").u32(4).u32(1).str("k").u32(4).u32(2);
    assert!(matches!(err(b.data(0)), GgufError::DuplicateKey { .. }));

    let mut b = Bytes::gguf(3, 0, 1);
    b.str("general.alignment").u32(4).u32(48);
    assert!(matches!(
        err(b.data(0)),
        GgufError::BadAlignment { found: 48, .. }
    ));

    // Arrays nested past the limit.
    let mut b = Bytes::gguf(3, 0, 1);
    b.str("deep");
    b.u32(9);
    for _ in 0..20 {
        b.u32(9).u64(1);
    }
    assert!(matches!(err(b.data(0)), GgufError::NestingTooDeep { .. }));
}

#[test]
fn every_truncation_is_an_error() {
    let good = sample_file();
    let file = GgufFile::from_bytes(good.clone()).unwrap();
    let needed = file
        .tensors()
        .iter()
        .map(|t| file.data_offset() + t.offset + t.bytes)
        .max()
        .unwrap() as usize;
    for len in 0..needed {
        assert!(
            GgufFile::from_bytes(good[..len].to_vec()).is_err(),
            "a file cut to {len} of {needed} bytes was accepted"
        );
    }
}

/// Deterministic xorshift, enough to spread flips over the file.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn flipped_bytes_never_panic() {
    let good = sample_file();
    let file = GgufFile::from_bytes(good.clone()).unwrap();
    let header_len = file.data_offset() as usize;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut errors = 0;
    let trials = 20_000;
    for _ in 0..trials {
        let mut bad = good.clone();
        let flips = 1 + next(&mut state) % 4;
        for _ in 0..flips {
            // Flips land in the header: data bytes are not interpreted by the reader.
            let at = (next(&mut state) % header_len as u64) as usize;
            bad[at] ^= 1 << (next(&mut state) % 8);
        }
        let cut = if next(&mut state).is_multiple_of(4) {
            (next(&mut state) % bad.len() as u64) as usize
        } else {
            bad.len()
        };
        let result = std::panic::catch_unwind(|| GgufFile::from_bytes(bad[..cut].to_vec()).err());
        match result {
            Ok(Some(e)) => {
                errors += 1;
                assert!(!e.to_string().is_empty());
            }
            Ok(None) => {}
            Err(_) => panic!("the reader panicked on a corrupted file"),
        }
    }
    // Most corruptions of a header are detected (the rest change a name or a value).
    assert!(
        errors > trials / 2,
        "only {errors} of {trials} corruptions were refused"
    );
}
