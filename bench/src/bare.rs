//! Part 2's workers in a `workerd serve` of their own, as production runs
//! them (`edge_limiter_local::bare`): no wrangler, no inspector, no proxy
//! in front, to show whether its ratios hold without `wrangler dev`'s costs.

use std::path::PathBuf;

pub use edge_limiter_local::bare::LOG;

use crate::{gc, stack::Worker};

/// The worker `like` runs in `wrangler dev`, from the same `wrangler.toml`,
/// in a workerd of its own under `label` in `dir`; returns at once, see
/// [`Worker::ready`]. Its V8 writes a line per collection to its log
/// ([`gc::scavenges`] reads them).
pub fn spawn(label: &'static str, like: &Worker, dir: PathBuf) -> Result<Worker, String> {
    let bare = edge_limiter_local::bare::start_with_v8(&like.dir, &dir, &[gc::TRACE])?;
    Ok(Worker {
        label,
        url: bare.url,
        dir,
        group: bare.process,
        bare: true,
    })
}
