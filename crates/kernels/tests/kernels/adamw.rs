//! The one-pass AdamW kernel against AdamW in f64 on the host, over
//! several steps with and without weight decay, and its launcher's checks.

use crate::common;

use common::{assert_close, download, upload, Rng};
use ferrotron_kernels::adamw::{adamw_update, AdamWScalars};

/// AdamW's hyper-parameters of the tests (not torch's defaults, so a
/// swapped `beta1`/`beta2` or a missing bias correction shows).
const BETA1: f64 = 0.8;
const BETA2: f64 = 0.95;
const EPS: f64 = 1e-6;
const LR: f64 = 0.05;
const WEIGHT_DECAY: f64 = 0.3;
const STEPS: i32 = 4;

/// Error bound, relative to the largest magnitude of the reference: the
/// parameters and moments through f32 arithmetic (a few roundings each per
/// step, the parameters stored in f32 after each) against f64 (seen on
/// lavapipe: 2.0e-7). The parameters move by up to `LR` per step, so
/// an update wrong by 1e-4 of itself already shows.
const TOLERANCE: f32 = 1e-6;

/// The scalars of step `t` (from 1), as `AdamW` forms them in f64.
fn scalars(t: i32, decay: bool) -> AdamWScalars {
    AdamWScalars::from_f64(
        BETA1,
        BETA2,
        (1.0 - BETA2.powi(t)).sqrt(),
        EPS,
        LR / (1.0 - BETA1.powi(t)),
        decay.then_some(1.0 - LR * WEIGHT_DECAY),
    )
}

/// AdamW in f64 (torch.optim.AdamW's formula): `(p, m, v)` after one step
/// `t` with gradient `g`.
fn reference_step(t: i32, decay: bool, p: &mut [f64], m: &mut [f64], v: &mut [f64], g: &[f32]) {
    for i in 0..p.len() {
        let g = f64::from(g[i]);
        if decay {
            p[i] *= 1.0 - LR * WEIGHT_DECAY;
        }
        m[i] = BETA1 * m[i] + (1.0 - BETA1) * g;
        v[i] = BETA2 * v[i] + (1.0 - BETA2) * g * g;
        let m_hat = m[i] / (1.0 - BETA1.powi(t));
        let v_hat = v[i] / (1.0 - BETA2.powi(t));
        p[i] -= LR * m_hat / (v_hat.sqrt() + EPS);
    }
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Lengths with vector widths 4, 2 and 1, one vector, and several cubes
/// with a partial last one; [`STEPS`] steps each, with and without decay;
/// every step's parameters and moments against the f64 reference.
#[test]
fn adamw_kernel_matches_f64_adamw_over_several_steps() {
    let client = common::client();
    let mut rng = Rng::new(31);
    for decay in [false, true] {
        for len in [1usize, 6, 37, 4, 1027, 4100] {
            let p0 = rng.vec(len, -2.0, 2.0);
            let (ph, mh, vh) = (
                upload(&client, &p0),
                upload(&client, &vec![0.0; len]),
                upload(&client, &vec![0.0; len]),
            );
            let mut p: Vec<f64> = p0.iter().map(|&x| f64::from(x)).collect();
            let (mut m, mut v) = (vec![0.0; len], vec![0.0; len]);
            for t in 1..=STEPS {
                // Gradients of varying scale and sign, some exactly zero.
                let scale = [1.0, 0.01, 3.0, 0.5][(t as usize - 1) % 4];
                let g: Vec<f32> = rng
                    .vec(len, -scale, scale)
                    .into_iter()
                    .enumerate()
                    .map(|(i, x)| if i % 11 == 5 { 0.0 } else { x })
                    .collect();
                let gh = upload(&client, &g);
                adamw_update(&client, &ph, &gh, &mh, &vh, len, scalars(t, decay)).unwrap();
                reference_step(t, decay, &mut p, &mut m, &mut v, &g);
                let what = |name: &str| format!("decay {decay}, len {len}, step {t}: {name}");
                assert_close(&what("p"), &download(&client, &ph), &to_f32(&p), TOLERANCE);
                assert_close(&what("m"), &download(&client, &mh), &to_f32(&m), TOLERANCE);
                assert_close(&what("v"), &download(&client, &vh), &to_f32(&v), TOLERANCE);
            }
        }
    }
}

/// The launcher refuses a buffer shorter than `len` values, naming it, and
/// a zero length, before launching anything.
#[test]
fn adamw_launcher_refuses_short_buffers() {
    let client = common::client();
    let full = || upload(&client, &[0.5; 8]);
    let (p, g, m, v) = (full(), full(), full(), upload(&client, &[0.0; 7]));
    let err = adamw_update(&client, &p, &g, &m, &v, 8, scalars(1, false)).unwrap_err();
    assert_eq!(err.op, "adamw_update");
    assert!(err.message.starts_with("v holds 28 bytes"), "{err}");
    let err = adamw_update(&client, &p, &g, &m, &v, 0, scalars(1, false)).unwrap_err();
    assert!(err.message.contains("len must be at least 1"), "{err}");
    assert_eq!(download(&client, &p), vec![0.5; 8], "p was written");
}
