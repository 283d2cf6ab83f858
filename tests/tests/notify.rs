//! Notifications between two engines over loopback (tcp and shm data paths): sent once after
//! the transfer they follow, never for a failed one, bounded in size and in the receiver's
//! queue, and probes of live and dead peers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_engine::notify::{MAX_NOTIFY_BYTES, QUEUE_CAPACITY};
use crescent_engine::{EngineError, Notification, Opcode, TransferEngine, TransferRequest};
use crescent_tests::{loopback_engine, same_host_engine};

/// The notifications `engine` receives within `wait` (polling), all taken.
fn received(engine: &TransferEngine, want: usize, wait: Duration) -> Vec<Notification> {
    let end = Instant::now() + wait;
    let mut got = Vec::new();
    while got.len() < want && Instant::now() < end {
        got.extend(engine.take_notifies());
        std::thread::sleep(Duration::from_millis(5));
    }
    got
}

fn write_with_notify(target: &Arc<TransferEngine>, initiator: &Arc<TransferEngine>) {
    let remote = target.alloc_registered(1 << 20, "cpu:0").unwrap();
    let local = initiator.alloc_registered(1 << 20, "cpu:0").unwrap();
    // SAFETY: test memory, not in a transfer while written.
    unsafe { local.as_mut_slice() }.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let batch = initiator.allocate_batch(4).unwrap();
    let reqs: Vec<TransferRequest> = (0..4)
        .map(|i| TransferRequest {
            opcode: Opcode::Write,
            source: local.addr() + i * (256 << 10),
            target: seg,
            target_offset: remote.addr() + i * (256 << 10),
            length: 256 << 10,
        })
        .collect();
    initiator.submit_with_notify(batch, &reqs, Notification::new("agent-a", &b"kv ready \x00\xff"[..])).unwrap();
    let statuses = initiator.wait_batch(batch, Some(Duration::from_secs(30))).unwrap();
    assert!(statuses.iter().all(|s| *s == crescent_engine::TransferStatus::Completed), "{statuses:?}");
    // Polled again and again: still one notification.
    for _ in 0..3 {
        let _ = initiator.batch_status(batch).unwrap();
    }
    initiator.free_batch(batch).unwrap();
    let got = received(target, 1, Duration::from_secs(10));
    assert_eq!(got, vec![Notification::new("agent-a", &b"kv ready \x00\xff"[..])]);
    // The data was in place when the notification came.
    // SAFETY: no transfer is running.
    assert_eq!(unsafe { remote.as_slice() }, unsafe { local.as_slice() });
    std::thread::sleep(Duration::from_millis(200));
    assert!(target.take_notifies().is_empty(), "delivered exactly once");
}

#[test]
fn a_notification_follows_its_completed_batch_once_over_tcp() {
    let (target, initiator) = (loopback_engine(Duration::from_secs(30)), loopback_engine(Duration::from_secs(30)));
    write_with_notify(&target, &initiator);
}

#[test]
fn a_notification_follows_its_completed_batch_once_over_shm() {
    let (target, initiator) = (same_host_engine(Duration::from_secs(30)), same_host_engine(Duration::from_secs(30)));
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    assert_eq!(initiator.segment_transport(seg).unwrap(), crescent_engine::TransportKind::Shm);
    write_with_notify(&target, &initiator);
}

#[test]
fn a_failed_transfer_sends_no_notification() {
    let (target, initiator) = (loopback_engine(Duration::from_secs(30)), loopback_engine(Duration::from_secs(30)));
    let remote = target.alloc_registered(4096, "cpu:0").unwrap();
    let local = initiator.alloc_registered(8192, "cpu:0").unwrap();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let batch = initiator.allocate_batch(2).unwrap();
    let ok = TransferRequest {
        opcode: Opcode::Write,
        source: local.addr(),
        target: seg,
        target_offset: remote.addr(),
        length: 16,
    };
    let out_of_range = TransferRequest { target_offset: remote.addr() + 4000, length: 200, ..ok };
    initiator.submit_with_notify(batch, &[ok, out_of_range], Notification::new("a", "must not arrive")).unwrap();
    let statuses = initiator.wait_batch(batch, Some(Duration::from_secs(30))).unwrap();
    assert!(matches!(statuses[1], crescent_engine::TransferStatus::Failed(_)), "{statuses:?}");
    initiator.free_batch(batch).unwrap();
    // A later batch's notification does arrive: the failed one was dropped, not delayed.
    let batch = initiator.allocate_batch(1).unwrap();
    initiator.submit_with_notify(batch, &[ok], Notification::new("a", "second")).unwrap();
    initiator.wait_batch(batch, Some(Duration::from_secs(30))).unwrap();
    assert_eq!(received(&target, 1, Duration::from_secs(10)), vec![Notification::new("a", "second")]);
    // Bad input: no request, an unknown segment, a local range not registered.
    assert!(matches!(
        initiator.submit_with_notify(batch, &[], Notification::new("a", "b")),
        Err(EngineError::InvalidArgument(_))
    ));
    let unknown = TransferRequest { target: 9999, ..ok };
    assert!(matches!(
        initiator.submit_with_notify(batch, &[unknown], Notification::new("a", "b")),
        Err(EngineError::UnknownSegment(9999))
    ));
    let batch = initiator.allocate_batch(1).unwrap();
    let unregistered = TransferRequest { source: 0x10, ..ok };
    let err = initiator.submit_with_notify(batch, &[unregistered], Notification::new("a", "b")).unwrap_err();
    assert!(matches!(err, EngineError::LocalNotRegistered { request: 0, .. }), "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(target.take_notifies().is_empty());
}

#[test]
fn notifications_are_bounded_in_size_and_in_the_receivers_queue() {
    let (target, sender) = (loopback_engine(Duration::from_secs(30)), loopback_engine(Duration::from_secs(30)));
    let name = target.segment_name().to_string();
    let too_big = Notification::new("a", vec![b'x'; MAX_NOTIFY_BYTES]);
    let err = sender.send_notify_to(&name, &too_big).unwrap_err();
    assert!(matches!(err, EngineError::NotifyTooLarge { .. }) && err.is_caller_error(), "{err}");
    let largest = Notification::new("a", vec![b'x'; MAX_NOTIFY_BYTES - 1]);
    sender.send_notify_to(&name, &largest).unwrap();
    for i in 1..QUEUE_CAPACITY {
        sender.send_notify_to(&name, &Notification::new("a", i.to_string())).unwrap();
    }
    let err = sender.send_notify_to(&name, &Notification::new("a", "one too many")).unwrap_err();
    assert!(matches!(err, EngineError::NotifyQueueFull { .. }) && !err.is_caller_error(), "{err}");
    let got = target.take_notifies();
    assert_eq!(got.len(), QUEUE_CAPACITY);
    assert_eq!(got[0], largest);
    assert_eq!(got[QUEUE_CAPACITY - 1].message, (QUEUE_CAPACITY - 1).to_string().into_bytes());
    // Taken: room again.
    sender.send_notify_to(&name, &Notification::new("a", "after")).unwrap();
    assert_eq!(target.take_notifies(), vec![Notification::new("a", "after")]);
}

#[test]
fn probes_tell_live_peers_from_dead_ones() {
    let (target, prober) = (loopback_engine(Duration::from_secs(30)), loopback_engine(Duration::from_secs(30)));
    prober.probe(target.segment_name()).unwrap();
    let name = target.segment_name().to_string();
    drop(target);
    // The listener closes once its thread sees the engine gone.
    let end = Instant::now() + Duration::from_secs(10);
    let err = loop {
        match prober.probe(&name) {
            Err(e) => break e,
            Ok(()) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            Ok(()) => panic!("{name} still answers probes after its engine was dropped"),
        }
    };
    assert!(!err.is_caller_error(), "{err}");
    assert!(prober.send_notify_to(&name, &Notification::new("a", "b")).is_err());
    assert!(prober.probe("not a segment name").unwrap_err().is_caller_error());
}
