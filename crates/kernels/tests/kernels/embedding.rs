//! The embedding gradient kernel against a host scatter-add in token order
//! (the same f32 additions in the same order, so the same bits): repeated
//! ids, ids in one bucket and in many, ids past the vocabulary (skipped),
//! token counts around the kernel's 256-id staging and column counts
//! around its 32-column cubes.

use crate::common;

use common::{download, upload, upload_u32, zeros, Rng};
use ferrotron_kernels::embedding::{embedding_grad, BUCKETS};

/// The host scatter-add: `table[id, c] += rows[t, c]` for `t` in order,
/// ids at or past `vocab` skipped.
fn scatter_add(ids: &[u32], rows: &[f32], vocab: usize, dim: usize) -> Vec<f32> {
    let mut table = vec![0.0f32; vocab * dim];
    for (t, &id) in ids.iter().enumerate() {
        let id = id as usize;
        if id < vocab {
            for c in 0..dim {
                table[id * dim + c] += rows[t * dim + c];
            }
        }
    }
    table
}

#[test]
fn embedding_grad_equals_a_sequential_scatter_add() {
    let client = common::client();
    let mut rng = Rng::new(41);
    // (tokens, dim, vocab): one and several staging steps, a ragged last
    // one; one and several column cubes, a ragged last one.
    for (tokens, dim, vocab) in [(1, 1, 1), (255, 32, 70), (600, 40, 300), (513, 77, 5)] {
        let mut ids: Vec<u32> = (0..tokens).map(|_| rng.below(vocab) as u32).collect();
        // Rows sharing a bucket, a popular id, and ids past the vocabulary.
        ids[0] = (vocab - 1) as u32;
        if tokens > 4 {
            ids[1] = ids[0];
            ids[2] = (vocab + BUCKETS) as u32;
            ids[3] = u32::MAX;
        }
        let rows = rng.vec(tokens * dim, -1.0, 1.0);
        let table = zeros(&client, vocab * dim);
        embedding_grad(
            &client,
            &upload_u32(&client, &ids),
            &upload(&client, &rows),
            &table,
            tokens,
            dim,
            vocab,
        )
        .unwrap();
        assert_eq!(
            download(&client, &table),
            scatter_add(&ids, &rows, vocab, dim),
            "[{tokens}, {dim}] into {vocab} rows"
        );
    }
}

#[test]
fn embedding_grad_names_the_short_buffer() {
    let client = common::client();
    let (ids, rows, table) = (
        upload_u32(&client, &[0, 1, 2]),
        zeros(&client, 12),
        zeros(&client, 8),
    );
    let err = embedding_grad(&client, &ids, &rows, &table, 3, 4, 3).unwrap_err();
    assert!(err.to_string().contains("d_table holds 32 bytes"), "{err}");
    let err = embedding_grad(&client, &ids, &rows, &table, 4, 2, 4).unwrap_err();
    assert!(err.to_string().contains("ids holds 12 bytes"), "{err}");
}
