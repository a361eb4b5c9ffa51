//! Web-chat sessions told when one of their turns starts or ends on this node, so that their
//! event streams read the store then, instead of each stream reading it every moment. A turn
//! run by another node is seen at the streams' slow poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

/// The sessions that have a stream open here, each with a counter bumped on every change.
#[derive(Default)]
pub struct ChatSignals {
    sessions: Mutex<HashMap<String, Weak<watch::Sender<u64>>>>,
    /// Told the client address of each anonymous web-chat turn that ends in review here.
    anonymous_items: std::sync::OnceLock<AnonymousItems>,
}

type AnonymousItems = Box<dyn Fn(&str) + Send + Sync>;

/// A stream's hold on its session's signal: `changed` resolves on the next change.
pub struct Subscription {
    _sender: Arc<watch::Sender<u64>>,
    receiver: watch::Receiver<u64>,
}

impl Subscription {
    /// Resolves when the session's turn started or ended here since the last call.
    pub async fn changed(&mut self) {
        // The sender lives as long as this subscription: it cannot close under it.
        let _ = self.receiver.changed().await;
    }
}

impl ChatSignals {
    /// What to do when a turn of an anonymous visitor at an address ends in review (the web
    /// chat's ingress counts it against the address's hand-off bucket); set once.
    pub fn on_anonymous_item(&self, told: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.anonymous_items.set(Box::new(told));
    }

    /// A turn of an anonymous visitor at `address` ended in review here.
    pub fn anonymous_item(&self, address: &str) {
        if let Some(told) = self.anonymous_items.get() {
            told(address);
        }
    }

    pub fn subscribe(&self, session: &str) -> Subscription {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let sender = match sessions.get(session).and_then(Weak::upgrade) {
            Some(sender) => sender,
            None => {
                // Now and then, forget the sessions whose streams all ended.
                if sessions.len() > 1024 {
                    sessions.retain(|_, s| s.strong_count() > 0);
                }
                let sender = Arc::new(watch::channel(0).0);
                sessions.insert(session.to_owned(), Arc::downgrade(&sender));
                sender
            }
        };
        let receiver = sender.subscribe();
        Subscription {
            _sender: sender,
            receiver,
        }
    }

    /// A turn of `session` started or ended.
    pub fn changed(&self, session: &str) {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = sessions.get(session).and_then(Weak::upgrade) {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_reaches_every_stream_of_its_session_and_no_other() {
        let signals = ChatSignals::default();
        let (mut a, mut b, mut other) = (
            signals.subscribe("s-1"),
            signals.subscribe("s-1"),
            signals.subscribe("s-2"),
        );
        signals.changed("s-1");
        a.changed().await;
        b.changed().await;
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(20), other.changed());
        assert!(quiet.await.is_err(), "another session was not told");
        signals.changed("nobody");
    }
}
