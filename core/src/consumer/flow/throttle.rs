//! The consumer's throttle: its local token bucket (messages per period),
//! and the token each delivery waits for, from the bucket and, with a
//! store, from the shared lease: its part of `impl Consumer`.

use super::super::Consumer;
use crate::throttle::Throttle;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a wait for the next token looks whether the consumer stopped.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// A throttle's bucket.
#[derive(Debug)]
pub(crate) struct Bucket {
    throttle: Throttle,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub(crate) fn new(throttle: Throttle) -> Self {
        Bucket { throttle, state: Mutex::new((f64::from(throttle.limit), Instant::now())) }
    }

    /// Take a token, or say how long until one is there.
    pub(crate) fn take(&self, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(self.throttle.limit) / self.throttle.per.as_secs_f64();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = *st;
        let tokens = (tokens + now.saturating_duration_since(at).as_secs_f64() * rate).min(f64::from(self.throttle.limit));
        if tokens >= 1.0 {
            *st = (tokens - 1.0, now);
            Ok(())
        } else {
            *st = (tokens, now);
            Err(Duration::from_secs_f64((1.0 - tokens) / rate))
        }
    }

    /// Give a token back (it was taken for a delivery that did not come).
    pub(crate) fn refund(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.0 = (st.0 + 1.0).min(f64::from(self.throttle.limit));
    }
}

impl Consumer {
    /// Wait, on a thread outside the runtime, for the throttle's next token,
    /// at most `timeout`: false when none came, or the consumer stopped
    /// meanwhile (seen within [`STOP_CHECK`]: a cancel is never held until
    /// a token of a long period comes).
    pub(in crate::consumer) fn flow_token_blocking(&self, timeout: Duration) -> bool {
        let Some(bucket) = &self.flow.bucket else { return true };
        let until = Instant::now() + timeout;
        loop {
            match bucket.take(Instant::now()).and_then(|()| self.take_shared(bucket)) {
                Ok(()) => return true,
                Err(wait) => {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() || self.link.is_closed() {
                        return false;
                    }
                    std::thread::sleep(wait.min(left).min(STOP_CHECK));
                }
            }
        }
    }

    /// The throttle's next token, awaited; at once, with none, once the
    /// consumer has stopped (its pop then says so).
    pub(in crate::consumer) async fn flow_token(&self) {
        let Some(bucket) = &self.flow.bucket else { return };
        loop {
            let wait = match bucket.take(Instant::now()) {
                Err(wait) => wait,
                Ok(()) => match self.flow.shared.clone() {
                    None => return,
                    // The store's round trip off the runtime's workers.
                    Some(shared) => match crate::sql::blocking::off_runtime(move || Ok(shared.take())).await {
                        Ok(Ok(())) => return,
                        Ok(Err(wait)) => {
                            bucket.refund();
                            wait
                        }
                        Err(_) => {
                            bucket.refund();
                            crate::throttle::STORE_RETRY
                        }
                    },
                },
            };
            if self.link.is_closed() {
                return;
            }
            tokio::time::sleep(wait.min(STOP_CHECK)).await;
        }
    }

    /// After the local bucket's token, a token of the shared lease (when
    /// there is a store); without one, the local token goes back.
    fn take_shared(&self, bucket: &Bucket) -> Result<(), Duration> {
        let Some(shared) = &self.flow.shared else { return Ok(()) };
        shared.take().inspect_err(|_| bucket.refund())
    }

    /// A token taken for a delivery that did not come.
    pub(in crate::consumer) fn flow_refund(&self) {
        if let Some(bucket) = &self.flow.bucket {
            bucket.refund();
        }
        if let Some(shared) = &self.flow.shared {
            shared.refund();
        }
    }

}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused_with_what_to_give() {
        assert!(Throttle::new(0, Duration::from_secs(1)).validate().is_err());
        assert!(Throttle::new(1, Duration::from_secs(1)).validate().is_ok());
    }

    #[test]
    fn a_bucket_lets_its_limit_through_then_one_per_interval() {
        let b = Bucket::new(Throttle::new(10, Duration::from_secs(1)));
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(b.take(t0).is_ok());
        }
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        b.refund();
        assert!(b.take(t0 + Duration::from_millis(100)).is_ok());
        assert!(b.take(t0 + Duration::from_millis(100)).is_err());
    }
}
