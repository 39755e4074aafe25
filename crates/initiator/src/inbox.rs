//! A task's mailbox: the PDUs the connection readers route to one command.
//!
//! One per command, so it must be cheap: tokio's unbounded channel allocates a 32-slot block
//! for its first message, which at 4 KiB random reads was a fair share of the initiator's
//! allocations and page faults. This is a queue behind a mutex that no one holds for more
//! than a push or a pop, and the one waker of the one receiving task.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

struct Inner<T> {
    items: VecDeque<T>,
    /// The sender is gone: once the queue is empty, `recv` answers `None`.
    closed: bool,
    waker: Option<Waker>,
}

type Shared<T> = Arc<Mutex<Inner<T>>>;

/// The sending half; dropping it closes the inbox.
pub(crate) struct Sender<T>(Shared<T>);

/// The receiving half.
pub(crate) struct Receiver<T>(Shared<T>);

pub(crate) fn inbox<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Mutex::new(Inner {
        items: VecDeque::new(),
        closed: false,
        waker: None,
    }));
    (Sender(shared.clone()), Receiver(shared))
}

fn lock<T>(s: &Shared<T>) -> std::sync::MutexGuard<'_, Inner<T>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T> Sender<T> {
    /// Queues `item` and wakes the receiver; never blocks, never fails (an item for a
    /// receiver that is gone is dropped with the inbox).
    pub(crate) fn send(&self, item: T) {
        let waker = {
            let mut inner = lock(&self.0);
            inner.items.push_back(item);
            inner.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut inner = lock(&self.0);
            inner.closed = true;
            inner.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// The next item; `None` once the sender is gone and everything sent was taken.
    /// Cancel-safe: an item is only taken by a call that returns it.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| {
            let mut inner = lock(&self.0);
            if let Some(item) = inner.items.pop_front() {
                return Poll::Ready(Some(item));
            }
            if inner.closed {
                return Poll::Ready(None);
            }
            match &inner.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => inner.waker = Some(cx.waker().clone()),
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn items_arrive_in_order_then_none_after_the_sender_goes() {
        let (tx, mut rx) = inbox();
        tx.send(1);
        tx.send(2);
        assert_eq!(rx.recv().await, Some(1));
        let waiter = tokio::spawn(async move {
            let mut got = vec![rx.recv().await];
            got.push(rx.recv().await);
            got.push(rx.recv().await);
            got
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send(3);
        drop(tx);
        assert_eq!(waiter.await.unwrap(), vec![Some(2), Some(3), None]);
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_the_senders_drop() {
        let (tx, mut rx) = inbox::<u8>();
        let waiter = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(tx);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert_eq!(got.expect("woken").unwrap(), None);
    }

    #[tokio::test]
    async fn a_timed_out_recv_loses_nothing() {
        let (tx, mut rx) = inbox();
        assert!(tokio::time::timeout(Duration::from_millis(10), rx.recv())
            .await
            .is_err());
        tx.send(7);
        assert_eq!(rx.recv().await, Some(7));
    }

    #[test]
    fn many_senders_threads_one_receiver() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, mut rx) = inbox();
            let sender = std::thread::spawn(move || {
                for i in 0..10_000u32 {
                    tx.send(i);
                }
            });
            for i in 0..10_000u32 {
                assert_eq!(rx.recv().await, Some(i));
            }
            sender.join().unwrap();
            assert_eq!(rx.recv().await, None);
        });
    }
}
