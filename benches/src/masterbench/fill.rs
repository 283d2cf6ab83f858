//! Filling the master: new keys put in batches, up to its watermark, and the wait for its
//! sizes to settle.

use super::*;

/// Puts `count` new fill keys `o/<i>` (from `first` on), spread over all clients, in batches.
pub(super) async fn fill_keys(sims: &mut [Sim], first: u64, count: u64, batch: usize, size: u64) -> Result<Tally> {
    let clients = sims.len() as u64;
    let mut tasks = Vec::new();
    for (c, sim) in sims.iter().enumerate() {
        let mut rpc = sim.rpc.clone();
        let id = sim.id.clone();
        let c = c as u64;
        let mut tally = Tally::new();
        tasks.push(sim.lane.spawn(async move {
            let mine: Vec<u64> = (first..first + count).filter(|i| i % clients == c).collect();
            for chunk in mine.chunks(batch) {
                let keys: Vec<String> = chunk.iter().map(|i| format!("o/{i:010}")).collect();
                put_batch(&mut rpc, &id, keys, size, &mut tally).await;
            }
            tally
        }));
    }
    let mut all = Tally::new();
    for t in tasks {
        all.add(&t.await?);
    }
    if all.failed > 0 {
        bail!("{} fill call(s) failed; first: {}", all.failed, all.first_failure.unwrap_or_default());
    }
    Ok(all)
}

/// One batched put (BatchPutStart + BatchPutEnd of the keys that started); returns the keys put.
pub(super) async fn put_batch(
    rpc: &mut MasterClient<Channel>,
    id: &str,
    keys: Vec<String>,
    size: u64,
    tally: &mut Tally,
) -> Vec<String> {
    let t = Instant::now();
    let r = rpc
        .batch_put_start(BatchPutStartRequest {
            client_id: id.into(),
            sizes: vec![size; keys.len()],
            checksums: vec![VALUE_CRC; keys.len()],
            keys: keys.clone(),
            options: Some(PutOptions::default()),
        })
        .await;
    tally.record(Rpc::BatchPutStart, t.elapsed());
    let items = match r {
        Ok(r) => r.into_inner().items,
        Err(e) => {
            tally.fail(format!("BatchPutStart: {e}"));
            return Vec::new();
        }
    };
    let mut started = Vec::new();
    for (k, item) in keys.into_iter().zip(&items) {
        if ok(&item.status) {
            started.push(k);
        } else {
            tally.fail(format!("BatchPutStart {k}: {}", describe(&item.status)));
        }
    }
    if started.is_empty() {
        return started;
    }
    let t = Instant::now();
    let r =
        rpc.batch_put_end(BatchKeyRequest { client_id: id.into(), keys: started.clone(), ..Default::default() }).await;
    tally.record(Rpc::BatchPutEnd, t.elapsed());
    match r {
        Ok(r) => {
            let mut done = Vec::new();
            for (k, s) in started.into_iter().zip(r.into_inner().statuses.into_iter().map(Some)) {
                if ok(&s) {
                    done.push(k);
                } else {
                    tally.fail(format!("BatchPutEnd {k}: {}", describe(&s)));
                }
            }
            tally.ops += done.len() as u64;
            tally.puts += done.len() as u64;
            done
        }
        Err(e) => {
            tally.fail(format!("BatchPutEnd: {e}"));
            Vec::new()
        }
    }
}

/// Puts keys `t/...` until one more put would cross the watermark.
pub(super) async fn top_up(sims: &mut [Sim], args: &MasterArgs, filled: &mut u64, reserved: u64) -> Result<()> {
    // Ranges of objects evicted or removed count as used until their owners acknowledged the
    // drops: measured before that, the room is too small, and once they come back the store
    // is further below the watermark than the 64 puts that look for a round.
    let id = sims[0].id.clone();
    let (now, _) = settled(&mut sims[0].rpc, &id, reserved).await?;
    let limit = (now.capacity as f64 * args.high_watermark) as u64;
    // The put that makes used exceed the limit evicts; stop one before it.
    let room = limit.saturating_sub(now.used) / reserved;
    let count = room.saturating_sub(1);
    let t = fill_keys(sims, *filled, count, args.batch, args.value_size).await?;
    *filled += t.puts;
    Ok(())
}

/// How long the used bytes and objects must stay unchanged, with nothing in quarantine, for
/// an eviction round to count as over: the evictor's steps and the owners' acknowledgements
/// pause for milliseconds on a loaded machine.
pub(super) const QUIET: Duration = Duration::from_millis(200);

/// The sizes once no range waits in quarantine (every drop acknowledged: the used bytes are
/// the objects' own, `reserved` each) and nothing changed for [`QUIET`], or after 60 s; and
/// when they last changed (an eviction round ends there).
pub(super) async fn settled(rpc: &mut MasterClient<Channel>, id: &str, reserved: u64) -> Result<(Sizes, Instant)> {
    let start = Instant::now();
    let mut last = node_stats(rpc, id).await?;
    let mut quiet_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let s = node_stats(rpc, id).await?;
        if (s.used, s.objects) != (last.used, last.objects) {
            (last, quiet_since) = (s, Instant::now());
            continue;
        }
        let drained = s.used <= s.objects * reserved;
        if (drained && quiet_since.elapsed() >= QUIET) || start.elapsed() > Duration::from_secs(60) {
            return Ok((s, quiet_since));
        }
    }
}
