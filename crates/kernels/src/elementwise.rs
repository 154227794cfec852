//! Launch geometry of the element-wise kernels (SwiGLU, GELU, the bias add,
//! AdamW): one unit per vector of 4, 2 or 1 elements over a contiguous
//! buffer, 256 units per cube.

use cubecl::prelude::*;

/// Units per cube of the element-wise kernels.
const CUBE_DIM: u32 = 256;

/// Where an element-wise kernel over `len` elements runs: the vector width
/// (the largest of 4, 2, 1 dividing `len`, or a row length, see
/// [`geometry_rows`]), and the cubes covering the `len / vector` units (the
/// kernels guard `ABSOLUTE_POS` against it).
pub(crate) struct Geometry {
    /// Elements per vector (per unit).
    pub vector: usize,
    pub cube_count: CubeCount,
    pub cube_dim: CubeDim,
}

/// The [`Geometry`] of a kernel over `len` elements on `client`.
pub(crate) fn geometry<R: Runtime>(client: &ComputeClient<R>, len: usize) -> Geometry {
    geometry_rows(client, len, len)
}

/// The [`Geometry`] of a kernel over `len` elements of rows of `cols`
/// (`cols` divides `len`): its vectors never straddle two rows.
pub(crate) fn geometry_rows<R: Runtime>(
    client: &ComputeClient<R>,
    len: usize,
    cols: usize,
) -> Geometry {
    let vector = [4, 2, 1]
        .into_iter()
        .find(|v| cols.is_multiple_of(*v))
        .unwrap_or(1);
    let cube_dim = CubeDim::new_1d(CUBE_DIM);
    Geometry {
        vector,
        cube_count: cubecl::calculate_cube_count_elemwise(client, len / vector, cube_dim),
        cube_dim,
    }
}
