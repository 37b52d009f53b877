//! MCP sessions (openenv 0.10's `openenv/session/create` and `openenv/session/close`
//! over `POST /mcp`): a session made by id, which `tools/call` reaches with
//! `params.session_id` and a WebSocket reaches with `/ws?session_id=ID`. That is how
//! openenv's `MCPToolClient` plays: it resets and steps over the WebSocket and calls
//! tools over HTTP, on one environment.
//!
//! A registered session holds one of the `--max-sessions` slots from create to close
//! (a WebSocket attached to it takes none of its own). One not attached and idle past
//! `--session-timeout` is dropped at the next `/mcp` request, and so is one never used
//! (no tool call, no WebSocket) within [`UNUSED_GRACE`] of its creation: a client that
//! only creates sessions cannot hold every slot for a whole session timeout. (No
//! per-client cap: a trainer opens all its sessions from one address.) A close while a
//! WebSocket is attached is deferred to its detach, as openenv does.
use super::session::Session;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub type SessionRef = Arc<Mutex<Session>>;

/// How long a created session may wait for its first use (or the session timeout, if
/// shorter). openenv's client attaches its WebSocket right after the create.
pub const UNUSED_GRACE: Duration = Duration::from_secs(30);

struct Entry {
    session: SessionRef,
    attached: bool,
    /// A tool call or a WebSocket has reached it.
    used: bool,
    created: Instant,
    pending_close: bool,
    last_active: Instant,
    _slot: OwnedSemaphorePermit,
}

#[derive(Default)]
pub struct Registry {
    entries: Mutex<HashMap<String, Entry>>,
}

/// How a close went.
#[derive(Debug, PartialEq)]
pub enum Closed {
    Now,
    /// A WebSocket is attached: the session goes when it detaches.
    OnDetach,
}

/// The session behind a registry handle; a panic elsewhere cannot wedge it (every
/// `Session` method leaves it whole).
pub fn lock(s: &SessionRef) -> MutexGuard<'_, Session> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl Registry {
    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register a new session, taking a slot; None at capacity.
    pub fn create(&self, session: Session, slots: &Arc<Semaphore>) -> Option<String> {
        let slot = slots.clone().try_acquire_owned().ok()?;
        let id = super::session::new_episode_id();
        let entry = Entry {
            session: Arc::new(Mutex::new(session)),
            attached: false,
            used: false,
            created: Instant::now(),
            pending_close: false,
            last_active: Instant::now(),
            _slot: slot,
        };
        self.entries().insert(id.clone(), entry);
        Some(id)
    }

    /// The session `id`, marked active now.
    pub fn get(&self, id: &str) -> Option<SessionRef> {
        let mut entries = self.entries();
        let e = entries.get_mut(id)?;
        e.last_active = Instant::now();
        e.used = true;
        Some(e.session.clone())
    }

    pub fn close(&self, id: &str) -> Option<Closed> {
        let mut entries = self.entries();
        let e = entries.get_mut(id)?;
        if e.attached {
            e.pending_close = true;
            return Some(Closed::OnDetach);
        }
        entries.remove(id);
        Some(Closed::Now)
    }

    /// Attach a WebSocket to `id`; refused when unknown or already attached.
    pub fn attach(&self, id: &str) -> Result<SessionRef, String> {
        let mut entries = self.entries();
        let e = entries
            .get_mut(id)
            .ok_or_else(|| format!("Unknown session_id: {id}"))?;
        if e.attached {
            return Err(format!("Session {id} already has an attached WebSocket"));
        }
        e.attached = true;
        e.used = true;
        e.last_active = Instant::now();
        Ok(e.session.clone())
    }

    /// The WebSocket on `id` is gone: the session stays for its owner's next call,
    /// unless a close was asked for meanwhile.
    pub fn detach(&self, id: &str) {
        let mut entries = self.entries();
        let Some(e) = entries.get_mut(id) else { return };
        if e.pending_close {
            entries.remove(id);
        } else {
            e.attached = false;
            e.last_active = Instant::now();
        }
    }

    /// Drop sessions nobody has touched for `idle`, and those never used within
    /// [`UNUSED_GRACE`] (or `idle`, if shorter) of their creation; attached ones are the
    /// WebSocket's to time out.
    pub fn reap(&self, idle: Option<Duration>) {
        self.reap_with(idle, UNUSED_GRACE);
    }

    fn reap_with(&self, idle: Option<Duration>, unused: Duration) {
        let Some(idle) = idle else { return };
        let grace = idle.min(unused);
        self.entries().retain(|_, e| {
            e.attached
                || (e.last_active.elapsed() <= idle && (e.used || e.created.elapsed() <= grace))
        });
    }

    /// How long since `id` was last used (None: unknown).
    pub fn idle_for(&self, id: &str) -> Option<Duration> {
        self.entries().get(id).map(|e| e.last_active.elapsed())
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shutdown: drop every session; one with a WebSocket attached goes at its detach,
    /// so its slot comes back only then and the server's drain waits for that socket.
    pub fn close_all(&self) {
        self.entries().retain(|_, e| {
            e.pending_close = true;
            e.attached
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs::{create, Options};

    fn session() -> Session {
        Session::new(Arc::from(create("ticketmelt", &Options::new()).unwrap()))
    }

    #[test]
    fn lifecycle_capacity_attach_and_deferred_close() {
        let slots = Arc::new(Semaphore::new(2));
        let r = Registry::default();
        let a = r.create(session(), &slots).unwrap();
        let b = r.create(session(), &slots).unwrap();
        assert_ne!(a, b);
        assert!(r.create(session(), &slots).is_none(), "at capacity");
        assert_eq!(r.close(&b), Some(Closed::Now));
        assert_eq!(slots.available_permits(), 1, "the slot comes back");
        assert_eq!(r.close(&b), None);
        r.attach(&a).unwrap();
        assert!(r.attach(&a).err().unwrap().contains("already has"));
        assert!(r
            .attach("nope")
            .err()
            .unwrap()
            .contains("Unknown session_id"));
        assert_eq!(r.close(&a), Some(Closed::OnDetach));
        assert!(r.get(&a).is_some(), "still there while attached");
        r.detach(&a);
        assert!(r.get(&a).is_none() && r.is_empty());
        assert_eq!(slots.available_permits(), 2);
    }

    #[test]
    fn idle_sessions_are_reaped_unless_attached() {
        let slots = Arc::new(Semaphore::new(4));
        let r = Registry::default();
        let a = r.create(session(), &slots).unwrap();
        let b = r.create(session(), &slots).unwrap();
        r.attach(&b).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        r.reap(None);
        assert_eq!(r.len(), 2);
        r.reap(Some(Duration::from_millis(10)));
        assert!(r.get(&a).is_none() && r.get(&b).is_some());
        r.close_all();
        assert_eq!(slots.available_permits(), 3, "b is attached");
        r.detach(&b);
        assert_eq!(slots.available_permits(), 4);
    }

    #[test]
    fn a_session_never_used_goes_after_the_grace_and_a_used_one_stays() {
        let slots = Arc::new(Semaphore::new(4));
        let r = Registry::default();
        let day = Some(Duration::from_secs(86_400));
        let [unused, called, attached] = [0; 3].map(|_| r.create(session(), &slots).unwrap());
        assert!(r.get(&called).is_some());
        r.attach(&attached).unwrap();
        r.detach(&attached);
        std::thread::sleep(Duration::from_millis(20));
        r.reap_with(day, Duration::from_secs(1));
        assert_eq!(r.len(), 3, "within the grace");
        r.reap_with(day, Duration::from_millis(10));
        assert!(r.idle_for(&unused).is_none());
        assert!(r.idle_for(&called).is_some() && r.idle_for(&attached).is_some());
        assert_eq!(
            slots.available_permits(),
            2,
            "the unused session's slot is back"
        );
        r.reap_with(None, Duration::ZERO);
        assert_eq!(r.len(), 2, "no session timeout: nothing is reaped");
    }
}
