//! What a decode step reads back: greedy sampling on the device (`argmax`) against the
//! host's rule (the largest finite value, the lower index on ties, -0 and +0 equal, NaN and
//! infinities never chosen, `None` when no value is finite), and logits through page-locked
//! memory (`HostStage`, whole or in pieces) against the plain copy. GPU tests print a message and pass when no
//! driver, NVRTC or GPU is present.

use redlite_cuda::{
    argmax, argmax_rows, argmax_rows_queued, ids_of_keys, row_pieces, token_of_key, HostStage,
    MAX_ARGMAX_ROWS,
};

mod common;
use common::{device, Rng};

/// The host's greedy rule (`sampling::greedy_argmax` in the engine).
fn host_argmax(values: &[f32]) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (i, &v) in values.iter().enumerate() {
        if v.is_finite() && best.is_none_or(|b| v > b.1) {
            best = Some((i as u32, v));
        }
    }
    best.map(|b| b.0)
}

#[test]
fn the_device_argmax_follows_the_host_rule() {
    let Some(device) = device("the_device_argmax_follows_the_host_rule") else {
        return;
    };
    let mut rng = Rng(3);
    let mut key = device.alloc_zeros::<u64>(1).unwrap();
    // Few distinct values, so most lengths hold ties; then NaN, infinities and signed zeros.
    let pool = [-2.5f32, -0.0, 0.0, 1.0, 3.25];
    for n in [1usize, 7, 2048, 2049, 151_936] {
        for case in 0..4 {
            let mut values: Vec<f32> = (0..n)
                .map(|_| pool[rng.next() as usize % pool.len()])
                .collect();
            if case >= 1 {
                for _ in 0..n.div_ceil(10) {
                    let i = rng.next() as usize % n;
                    values[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][i % 3];
                }
            }
            if case == 2 {
                // Only negative values and zeros of both signs.
                values.iter_mut().for_each(|v| *v = -v.abs());
            }
            if case == 3 {
                values.iter_mut().for_each(|v| *v = f32::NAN);
            }
            let x = device.upload(&values).unwrap();
            let got = argmax(&device, &x.as_view(), &mut key).unwrap();
            assert_eq!(got, host_argmax(&values), "{n} values, case {case}");
        }
    }
}

/// Several rows in one launch: each row's key is its own (rows with ties, NaN, nothing
/// finite), the same as one launch per row.
#[test]
fn argmax_rows_picks_each_rows_argmax() {
    let Some(device) = device("argmax_rows_picks_each_rows_argmax") else {
        return;
    };
    let mut rng = Rng(9);
    let pool = [-1.5f32, 0.0, 2.0, 2.0, 7.5];
    for (rows, n) in [
        (1usize, 151_936usize),
        (2, 151_936),
        (4, 2049),
        (MAX_ARGMAX_ROWS, 33),
    ] {
        let mut values: Vec<f32> = (0..rows * n)
            .map(|_| pool[rng.next() as usize % pool.len()])
            .collect();
        if rows > 1 {
            // The second row has nothing finite.
            values[n..2 * n].iter_mut().for_each(|v| *v = f32::NAN);
        }
        let x = device.upload(&values).unwrap();
        let mut keys = device.alloc_zeros::<u64>(rows).unwrap();
        let mut best = vec![Some(u32::MAX); rows];
        argmax_rows(&device, &x.as_view(), &mut keys, &mut best).unwrap();
        let want: Vec<Option<u32>> = values.chunks(n).map(host_argmax).collect();
        assert_eq!(best, want, "{rows} rows of {n}");
    }
}

/// Chained greedy steps: keys queued into slots of a larger buffer (the slots before them
/// kept), then the tokens they name written on the device for an embedding to read; a row
/// with nothing finite gives id 0 there and no token on the host.
#[test]
fn queued_keys_hand_their_tokens_on_without_the_host() {
    let Some(device) = device("queued_keys_hand_their_tokens_on_without_the_host") else {
        return;
    };
    let mut rng = Rng(11);
    let n = 151_936;
    let mut keys = device.alloc_zeros::<u64>(MAX_ARGMAX_ROWS).unwrap();
    let mut want = Vec::new();
    // Slot 0 alone (a draft), then slots 1..4 (a verification of three rows).
    for (first, rows) in [(0usize, 1usize), (1, 3)] {
        let mut values: Vec<f32> = (0..rows * n)
            .map(|_| (rng.next() % 100_000) as f32 * 0.25 - 9.0)
            .collect();
        if rows == 3 {
            values[n..2 * n].iter_mut().for_each(|v| *v = f32::NAN);
        }
        let x = device.upload(&values).unwrap();
        let mut slots = keys.slice_mut(first..first + rows);
        argmax_rows_queued(&device, &x.as_view(), &mut slots).unwrap();
        want.extend(values.chunks(n).map(host_argmax));
    }
    let slots = want.len();
    let mut ids = device.upload(&vec![u32::MAX; slots + 1]).unwrap();
    let mut into = ids.slice_mut(1..slots + 1);
    ids_of_keys(&device, &keys.slice(..slots), &mut into).unwrap();
    let mut read = vec![0u64; slots];
    device
        .copy_to_host(&keys.slice(..slots), &mut read)
        .unwrap();
    let got: Vec<Option<u32>> = read.iter().map(|&k| token_of_key(k)).collect();
    assert_eq!(got, want, "the keys read on the host");
    let ids = device.download(&ids).unwrap();
    assert_eq!(ids[0], u32::MAX, "ids before the slots are kept");
    let on_device: Vec<u32> = want.iter().map(|t| t.unwrap_or(0)).collect();
    assert_eq!(&ids[1..], &on_device[..], "the ids written on the device");
}

/// `out` is the three -1.0 it held, then `want` bit for bit; cut back to the three.
fn assert_appended(out: &mut Vec<f32>, want: &[f32], case: &str) {
    assert_eq!(out.len(), 3 + want.len(), "{case}");
    assert!(
        out[3..]
            .iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{case}: the values differ"
    );
    assert_eq!(
        &out[..3],
        &[-1.0; 3],
        "{case}: what was in the buffer before is kept"
    );
    out.truncate(3);
}

#[test]
fn the_host_stage_appends_what_the_plain_copy_reads() {
    let Some(device) = device("the_host_stage_appends_what_the_plain_copy_reads") else {
        return;
    };
    let mut rng = Rng(5);
    let mut stage = HostStage::new();
    let mut out = vec![-1.0f32; 3];
    // Growing, then shrinking, then growing again: each copy appends exactly its values.
    for n in [1usize, 151_936, 2049, 303_872] {
        let values: Vec<f32> = (0..n)
            .map(|_| (rng.next() % 1000) as f32 * 0.5 - 7.0)
            .collect();
        let x = device.upload(&values).unwrap();
        let mut plain = vec![0.0f32; n];
        device.copy_to_host(&x.as_view(), &mut plain).unwrap();
        stage
            .append_to_host(&device, &x.as_view(), &mut out)
            .unwrap();
        assert_appended(
            &mut out,
            &plain,
            &format!("{n} values, against the plain copy"),
        );
    }
}

#[test]
fn the_host_stage_appends_pieces_in_order() {
    let Some(device) = device("the_host_stage_appends_pieces_in_order") else {
        return;
    };
    let mut rng = Rng(6);
    let mut stage = HostStage::new();
    let mut out = vec![-1.0f32; 3];
    // The LM head's pieces (one, four, eight, sixteen), a row of another length after them,
    // then a piece queued out of the buffer's range: refused, the next row unharmed.
    for (n, pieces) in [
        (151_936usize, 1usize),
        (151_936, 4),
        (151_936, 8),
        (2049, 16),
        (4096, 3),
    ] {
        let values: Vec<f32> = (0..n)
            .map(|_| (rng.next() % 1000) as f32 * 0.25 - 9.0)
            .collect();
        let x = device.upload(&values).unwrap();
        stage.begin_pieces(&device, n).unwrap();
        for range in row_pieces(n, pieces, false) {
            stage
                .queue_piece(&device, &x.slice(range.clone()), range)
                .unwrap();
        }
        stage.finish_pieces(&mut out).unwrap();
        assert_appended(&mut out, &values, &format!("{n} values in {pieces} pieces"));
    }
    let x = device.upload(&[1.0f32; 64]).unwrap();
    stage.begin_pieces(&device, 64).unwrap();
    let huge = 1usize << 40;
    assert!(stage
        .queue_piece(&device, &x.slice(0..64), huge..huge + 64)
        .is_err());
    // A row left with a piece queued, then the whole-row path on the same buffer.
    stage.begin_pieces(&device, 64).unwrap();
    stage.queue_piece(&device, &x.slice(0..64), 0..64).unwrap();
    out.clear();
    stage
        .append_to_host(&device, &x.as_view(), &mut out)
        .unwrap();
    assert_eq!(out, [1.0f32; 64]);
}
