//! One stage of work done a step ahead, on its own thread: while the training thread runs
//! step k, this thread prepares batch k+1 (with `augment_on: device`, the batched crop,
//! flip, blur and normalisation kernels; in every case the move to the training device).
//! The hand-over channel has no buffer, so at most one prepared batch waits and one is in
//! preparation: memory stays bounded and the order is the input's.
use std::sync::mpsc::{sync_channel, Receiver};
use std::time::{Duration, Instant};

/// The prepared items of an iterator, in order, each with the time the consumer waited.
pub struct Ahead<T, E> {
    rx: Receiver<Result<T, E>>,
    done: bool,
}

/// Runs `prepare` over `items` on a new thread, one item ahead of the consumer. Dropping
/// the returned iterator stops the thread after the item it is working on.
pub fn ahead<I, T, E, F>(items: I, mut prepare: F) -> Ahead<T, E>
where
    I: Iterator + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
    F: FnMut(I::Item) -> Result<T, E> + Send + 'static,
{
    let (tx, rx) = sync_channel(0);
    std::thread::spawn(move || {
        for item in items {
            let prepared = prepare(item);
            let failed = prepared.is_err();
            if tx.send(prepared).is_err() || failed {
                return;
            }
        }
    });
    Ahead { rx, done: false }
}

impl<T, E> Iterator for Ahead<T, E> {
    /// The prepared item and how long the consumer waited for it.
    type Item = Result<(T, Duration), E>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let start = Instant::now();
        match self.rx.recv() {
            Ok(Ok(t)) => Some(Ok((t, start.elapsed()))),
            Ok(Err(e)) => {
                self.done = true;
                Some(Err(e))
            }
            Err(_) => {
                self.done = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Polls `cond` for up to 10 s.
    fn eventually(cond: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        cond()
    }

    #[test]
    fn prepares_the_next_item_while_the_consumer_holds_one_and_no_more() {
        let prepared = Arc::new(AtomicUsize::new(0));
        let p = prepared.clone();
        let mut it = ahead(0..10usize, move |i| {
            p.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(i * 10)
        });
        let (first, _) = it.next().unwrap().unwrap();
        assert_eq!(first, 0);
        // While the consumer "trains" on item 0, item 1 gets prepared...
        assert!(eventually(|| prepared.load(Ordering::SeqCst) == 2));
        // ...and nothing beyond it (item 1 waits in the hand-over).
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(prepared.load(Ordering::SeqCst), 2);
        let rest: Vec<usize> = it.map(|r| r.unwrap().0).collect();
        assert_eq!(rest, (1..10).map(|i| i * 10).collect::<Vec<_>>());
    }

    #[test]
    fn an_error_ends_the_stream_after_being_reported() {
        let mut it = ahead(0..5usize, |i| {
            if i == 2 {
                Err(format!("item {i} failed"))
            } else {
                Ok(i)
            }
        });
        assert_eq!(it.next().unwrap().unwrap().0, 0);
        assert_eq!(it.next().unwrap().unwrap().0, 1);
        assert_eq!(it.next().unwrap().unwrap_err(), "item 2 failed");
        assert!(it.next().is_none());
    }

    #[test]
    fn dropping_the_consumer_stops_the_thread() {
        let prepared = Arc::new(AtomicUsize::new(0));
        let p = prepared.clone();
        let mut it = ahead(0.., move |i: usize| {
            p.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(i)
        });
        it.next().unwrap().unwrap();
        drop(it);
        std::thread::sleep(Duration::from_millis(100));
        let after_drop = prepared.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(prepared.load(Ordering::SeqCst), after_drop);
        assert!(after_drop <= 3, "{after_drop}");
    }
}
