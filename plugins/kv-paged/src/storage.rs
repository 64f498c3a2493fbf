//! One layer's K/V for every block of a pool: two MLX arrays `[H, S, D]`
//! of `S = capacity * block` token slots (block `i` owns slots
//! `i*block .. (i+1)*block`), written in place and read by one gather.
//!
//! Head-major slots make both hot paths single ops: a step's new tokens go
//! in with one `slice_update` (one row writing consecutive slots) or one
//! `scatter` (anything else), and a view of whole blocks comes out with one
//! `take` over `[H * capacity, block, D]` whose rows `(h, block)` are
//! already in `[B, H, T, D]` order. MLX reuses the source buffer of an
//! update when nothing else holds it, so writes cost the tokens written;
//! that is why nothing here keeps a view of the arrays between steps and
//! why copies inside the pool are evaluated before they are written back.

use model_kit::ops::{slice, slice_update, zeros};
use model_kit::{Array, Dtype, Result};
use plugin_sdk::mlx_rs;

pub struct Storage {
    keys: Array,
    values: Array,
    block: i32,
    capacity: i32,
}

/// `n` int32 indices as an MLX array.
pub fn indices(v: &[i32]) -> Array {
    Array::from_slice(v, &[v.len() as i32])
}

fn consecutive(v: &[i32]) -> bool {
    v.windows(2).all(|w| w[1] == w[0] + 1)
}

impl Storage {
    /// Zeros for `capacity` blocks (padding and unused slots read as zeros
    /// until written, so attention never meets NaN from fresh memory).
    pub fn new(capacity: usize, block: usize, heads: i32, dims: (i32, i32), dtype: Dtype) -> Result<Self> {
        let s = (capacity * block) as i32;
        Ok(Self {
            keys: zeros(&[heads, s, dims.0], dtype)?,
            values: zeros(&[heads, s, dims.1], dtype)?,
            block: block as i32,
            capacity: capacity as i32,
        })
    }

    /// The keys and values `[H, S, D]`, for attention that reads the pool
    /// in place (`PagedKv::attend`).
    pub fn arrays(&self) -> (&Array, &Array) {
        (&self.keys, &self.values)
    }

    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    pub fn dtype(&self) -> Dtype {
        self.keys.dtype()
    }

    /// Room for `capacity` blocks: one copy of what is held, amortised by
    /// the caller growing geometrically.
    pub fn grow(&mut self, capacity: usize) -> Result<()> {
        let extra = capacity as i32 - self.capacity;
        if extra <= 0 {
            return Ok(());
        }
        let grow = |a: &Array| -> Result<Array> {
            let s = a.shape();
            let z = zeros(&[s[0], extra * self.block, s[2]], a.dtype())?;
            mlx_rs::ops::concatenate(&[a.clone(), z], 1)
        };
        self.keys = grow(&self.keys)?;
        self.values = grow(&self.values)?;
        self.capacity = capacity as i32;
        Ok(())
    }

    /// Writes tokens of `k`/`v` `[R, H, L, D]` (token `r*L + l`) into
    /// `slots`: all of them in order, or those listed in `from`.
    pub fn put(&mut self, slots: &[i32], k: &Array, v: &Array, from: Option<&[i32]>) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let rows = k.shape()[0];
        let from_run = from.is_none_or(consecutive);
        if rows == 1 && from_run && consecutive(slots) {
            let first = from.map_or(0, |f| f[0]);
            let n = slots.len() as i32;
            let s0 = slots[0];
            let run = |a: &Array, dst: &Array| -> Result<Array> {
                let sh = a.shape();
                let part = slice(a, &[0, 0, first, 0], &[1, sh[1], first + n, sh[3]])?;
                let part = part.reshape(&[sh[1], n, sh[3]])?.as_dtype(dst.dtype())?;
                slice_update(dst, &part, &[0, s0, 0], &[sh[1], s0 + n, sh[3]])
            };
            self.keys = run(k, &self.keys)?;
            self.values = run(v, &self.values)?;
            return Ok(());
        }
        let at = indices(slots);
        let picked = from.map(indices);
        let scatter = |a: &Array, dst: &Array| -> Result<Array> {
            let sh = a.shape();
            // Token-major updates `[n, H, 1, D]` (a free reshape for L = 1).
            let t = a.transpose_axes(&[0, 2, 1, 3])?.reshape(&[sh[0] * sh[2], sh[1], 1, sh[3]])?;
            let t = match &picked {
                Some(p) => t.take_axis(p, 0)?,
                None => t,
            };
            mlx_rs::ops::indexing::scatter_single(dst, &at, t.as_dtype(dst.dtype())?, 1)
        };
        self.keys = scatter(k, &self.keys)?;
        self.values = scatter(v, &self.values)?;
        Ok(())
    }

    /// `[B, H, nb * block, D]` of the blocks `table` `[B, nb]` lists, as
    /// `flat` indices (`flat_table`): one gather per array (on the GPU our
    /// kernel's, `gather_kernel`).
    pub fn blocks(&self, flat: &Array, rows: i32, nb: i32) -> Result<(Array, Array)> {
        if model_kit::ops::on_gpu() {
            let get = |a: &Array| crate::gather_kernel::gather(a, flat, rows, nb, self.block);
            if let (Some(k), Some(v)) = (get(&self.keys)?, get(&self.values)?) {
                return Ok((k, v));
            }
        }
        let get = |a: &Array| -> Result<Array> {
            let sh = a.shape();
            let g = a.reshape(&[sh[0] * self.capacity, self.block, sh[2]])?.take_axis(flat, 0)?;
            g.reshape(&[rows, sh[0], nb * self.block, sh[2]])
        };
        Ok((get(&self.keys)?, get(&self.values)?))
    }

    /// The gather indices of `table` (`[B, nb]` block numbers, row-major):
    /// `(b, h, j) -> h * capacity + table[b, j]`, so the gathered blocks
    /// land in `[B, H, nb, ...]` order. Only the table is uploaded; the
    /// heads are spread on the device.
    pub fn flat_table(&self, table: &[i32], rows: usize, heads: i32) -> Result<Array> {
        let nb = (table.len() / rows.max(1)) as i32;
        let t = Array::from_slice(table, &[rows as i32, 1, nb]);
        let h = Array::arange::<_, i32>(0, heads * self.capacity, self.capacity)?.reshape(&[1, heads, 1])?;
        t.add(&h)?.reshape(&[-1])
    }

    /// `[1, H, n, D]` copies of the tokens in `slots` (buffers of their own).
    pub fn read(&self, slots: &[i32]) -> Result<(Array, Array)> {
        let at = indices(slots);
        let get = |a: &Array| -> Result<Array> {
            let sh = a.shape();
            a.take_axis(&at, 1)?.reshape(&[1, sh[0], slots.len() as i32, sh[2]])
        };
        Ok((get(&self.keys)?, get(&self.values)?))
    }

    /// Copies the tokens in `from` to the slots `to`. The copy is evaluated
    /// first: a pending read of the arrays would keep MLX from writing them
    /// in place, and the whole pool would be copied instead.
    pub fn copy(&mut self, from: &[i32], to: &[i32]) -> Result<()> {
        let (k, v) = self.read(from)?;
        mlx_rs::transforms::eval([&k, &v])?;
        self.put(to, &k, &v, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the keys' data lives, once evaluated.
    fn address(a: &Array) -> usize {
        a.eval().unwrap();
        a.as_slice::<f32>().as_ptr() as usize
    }

    /// Writes go into the pool's own buffer: a batch's scattered tokens and
    /// one row's run alike, with a view read in between (a copy of the pool
    /// per write would cost every step the whole pool).
    #[test]
    fn writes_reuse_the_pool_buffer() {
        let mut s = Storage::new(4, 4, 2, (4, 4), Dtype::Float32).unwrap();
        let two = Array::ones::<f32>(&[2, 2, 1, 4]).unwrap();
        s.put(&[0, 5], &two, &two, None).unwrap();
        let first = address(&s.keys);
        s.put(&[1, 6], &two, &two, None).unwrap();
        assert_eq!(address(&s.keys), first, "a batch's write copied the pool");
        let flat = s.flat_table(&[0, 1], 2, 2).unwrap();
        let (view, _) = s.blocks(&flat, 2, 1).unwrap();
        view.eval().unwrap();
        s.put(&[2, 7], &two, &two, None).unwrap();
        assert_eq!(address(&s.keys), first, "a write after a view copied the pool");
        let one = Array::ones::<f32>(&[1, 2, 1, 4]).unwrap();
        s.put(&[9], &one, &one, None).unwrap();
        assert_eq!(address(&s.keys), first, "one row's write copied the pool");
    }
}
