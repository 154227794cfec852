//! A counter-based normal generator: the value of element `i` of a tensor
//! is a pure function of (seed, tensor name, `i`), so any block of any
//! tensor can be drawn alone, in any order, on any rank, and equals the
//! same elements of the whole tensor (Salmon et al. 2011, "Parallel
//! random numbers: as easy as 1, 2, 3", with SplitMix64 as the mixer).
//!
//! Element `i` of the tensor keyed `key` takes outputs `2i` and `2i + 1`
//! of the SplitMix64 sequence started at `mix(seed + mix(key))`: two
//! uniforms `u1` in `(0, 1]` and `u2` in `[0, 1)` of 53 bits each, turned
//! into one standard normal by Box-Muller, `sqrt(-2 ln u1) cos(2 pi u2)`.

/// SplitMix64's increment (the golden ratio as a 64-bit fraction).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser (Stafford's Mix13): a bijection of `u64` whose
/// outputs pass BigCrush for counters as inputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 64-bit FNV-1a hash of `name` (a parameter's full dotted name,
/// `layers.3.attn.q.weight`): the key of its values.
pub fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The standard normals of one tensor, by element index.
#[derive(Clone, Copy, Debug)]
pub struct NormalStream {
    start: u64,
}

impl NormalStream {
    /// The values of the tensor keyed `key` ([`name_key`]) under `seed`.
    pub fn new(seed: u64, key: u64) -> Self {
        Self {
            start: mix(seed.wrapping_add(mix(key))),
        }
    }

    /// Output `n` of the SplitMix64 sequence from `start`.
    fn bits(&self, n: u64) -> u64 {
        mix(self
            .start
            .wrapping_add(n.wrapping_add(1).wrapping_mul(GOLDEN)))
    }

    /// The standard normal at element `index` of the tensor's flat
    /// (row-major) view, in f64.
    pub fn at(&self, index: u64) -> f64 {
        const UNIT: f64 = 1.0 / (1u64 << 53) as f64;
        let u1 = 1.0 - (self.bits(2 * index) >> 11) as f64 * UNIT;
        let u2 = (self.bits(2 * index + 1) >> 11) as f64 * UNIT;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_its_published_test_vectors() {
        // From the FNV reference test suite (Noll), 64-bit FNV-1a.
        assert_eq!(name_key(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(name_key("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(name_key("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs of Vigna's splitmix64.c seeded with 0 are the
        // finaliser of 1, 2, 3 times the increment.
        assert_eq!(mix(GOLDEN), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(GOLDEN.wrapping_mul(2)), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn draws_are_standard_normal() {
        let n = 100_000;
        let s = NormalStream::new(1234, name_key("layers.0.mlp.up.weight"));
        let x: Vec<f64> = (0..n).map(|i| s.at(i)).collect();
        let mean = x.iter().sum::<f64>() / n as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let kurtosis = x.iter().map(|v| (v - mean).powi(4)).sum::<f64>() / n as f64 / var.powi(2);
        // Standard errors at 1e5 draws: mean 0.0032, variance 0.0045,
        // kurtosis 0.015; the bounds are about five of them.
        assert!(mean.abs() < 0.016, "mean {mean}");
        assert!((var - 1.0).abs() < 0.023, "variance {var}");
        assert!((kurtosis - 3.0).abs() < 0.08, "kurtosis {kurtosis}");
        let within_one = x.iter().filter(|v| v.abs() < 1.0).count() as f64 / n as f64;
        assert!(
            (within_one - 0.6827).abs() < 0.008,
            "P(|z| < 1) {within_one}"
        );
    }

    #[test]
    fn neighbouring_elements_seeds_and_names_are_uncorrelated() {
        let n = 100_000;
        let a = NormalStream::new(7, name_key("embed"));
        let b = NormalStream::new(8, name_key("embed"));
        let c = NormalStream::new(7, name_key("head"));
        let corr =
            |f: &dyn Fn(u64) -> (f64, f64)| (0..n).map(|i| f(i).0 * f(i).1).sum::<f64>() / n as f64;
        for (what, r) in [
            ("lag 1", corr(&|i| (a.at(i), a.at(i + 1)))),
            ("seed", corr(&|i| (a.at(i), b.at(i)))),
            ("name", corr(&|i| (a.at(i), c.at(i)))),
        ] {
            assert!(r.abs() < 0.016, "{what}: correlation {r}");
        }
    }

    #[test]
    fn a_slice_drawn_alone_equals_the_same_elements_of_the_whole() {
        let whole: Vec<f64> = {
            let s = NormalStream::new(42, name_key("layers.1.attn.q.weight"));
            (0..1000).map(|i| s.at(i)).collect()
        };
        let (a, b) = (317, 654);
        let alone = NormalStream::new(42, name_key("layers.1.attn.q.weight"));
        let slice: Vec<f64> = (a..b).map(|i| alone.at(i as u64)).collect();
        assert_eq!(slice, whole[a..b]);
        // Drawing in reverse order changes nothing either.
        let reversed: Vec<f64> = (a..b).rev().map(|i| alone.at(i as u64)).collect();
        assert!(reversed.iter().rev().eq(whole[a..b].iter()));
    }
}
