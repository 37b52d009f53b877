//! The scripted seats (the original's witnesses, adversaries, relays and editor) and
//! how scripted seats answer verification requests.

#![allow(clippy::needless_range_loop)]

use super::rules::{
    claim_nonempty, mask_seats, Action, Claim, Kind, Mark, Msg, Report, Role, Source, Whispers,
    EMPTY, FIELDS, NONE, NO_TEXT, VALUES,
};

impl Whispers {
    /// What `seat` believes (for verification answers): its private view if it has one,
    /// else the per-field plurality of the claims it has received (by distinct origin).
    pub fn belief(&self, seat: usize) -> Claim {
        if claim_nonempty(&self.view[seat]) {
            return self.view[seat];
        }
        let mut counts = [[0u8; VALUES]; FIELDS];
        let mut seen = 0u16;
        for m in self.msgs.iter().rev() {
            if !matches!(m.kind, Kind::Dm | Kind::Broadcast) || !self.sees(seat, m) {
                continue;
            }
            let o = if m.origin == NONE { m.from } else { m.origin };
            if o as usize >= 16 || seen & (1 << o) != 0 {
                continue;
            }
            seen |= 1 << o;
            for f in 0..FIELDS {
                if m.claim[f] < VALUES as u8 {
                    counts[f][m.claim[f] as usize] += 1;
                }
            }
        }
        let mut out = EMPTY;
        for f in 0..FIELDS {
            let (mut best, mut bc) = (NONE, 0);
            for v in 0..VALUES {
                if counts[f][v] > bc {
                    bc = counts[f][v];
                    best = v as u8;
                }
            }
            out[f] = best;
        }
        out
    }

    /// A scripted seat's answer to a verification request from `asker` about `claim`.
    /// Honest seats answer from what they believe; adversaries from the lie.
    pub(super) fn answer(&self, seat: usize, asker: usize, claim: &Claim) -> Msg {
        let belief = self.belief(seat);
        let mut marks = [Mark::None; FIELDS];
        for f in 0..FIELDS {
            if claim[f] < VALUES as u8 {
                marks[f] = if belief[f] == NONE {
                    Mark::Unknown
                } else if belief[f] == claim[f] {
                    Mark::Confirm
                } else {
                    Mark::Deny
                };
            }
        }
        let conf = match self.role(seat) {
            Role::Witness => 0.85,
            Role::Adversary => 0.9,
            _ => 0.6,
        };
        Msg {
            from: seat as u8,
            to: asker as u8,
            kind: Kind::VerifyReply(marks),
            claim: belief,
            conf,
            turn: self.step,
            origin: seat as u8,
            source: if self.role(seat) == Role::Adversary {
                Source::Witness
            } else {
                Source::Role
            },
            text: NO_TEXT,
        }
    }

    /// A random neighbour of `seat` from the episode RNG (NONE if it has none).
    pub(super) fn random_neighbour(&mut self, seat: usize) -> u8 {
        let nb = self.neighbours(seat);
        let k = nb.count_ones();
        if k == 0 {
            return NONE;
        }
        let pick = self.rng.below(k as u64) as usize;
        mask_seats(nb).nth(pick).unwrap_or(0) as u8
    }

    /// The scripted seat's action this step (the original's rules).
    pub(super) fn scripted(&mut self, seat: usize) -> Action {
        let t = self.step;
        match self.role(seat) {
            Role::Witness => {
                let v = self.view[seat];
                if t == 0 {
                    let target = self.random_neighbour(seat);
                    if target != NONE {
                        return scripted_send(target, v, 0.85);
                    }
                } else if t == 1 {
                    return Action::Broadcast {
                        claim: v,
                        conf: 0.80,
                        source: None,
                        text: None,
                    };
                }
                Action::Wait
            }
            Role::Adversary => {
                let v = self.view[seat];
                if t.is_multiple_of(2) {
                    return Action::Broadcast {
                        claim: v,
                        conf: 0.90,
                        source: None,
                        text: None,
                    };
                }
                let target = self.random_neighbour(seat);
                if target == NONE {
                    return Action::Wait;
                }
                scripted_send(target, v, 0.92)
            }
            Role::Relay => {
                let Some(i) = self.relay_candidate(seat) else {
                    return Action::Wait;
                };
                // Forwarded directly (to keep the origin), not through `apply`.
                let m = self.msgs[i];
                let nb = self.neighbours(seat);
                let target = mask_seats(nb)
                    .find(|&k| k != m.from as usize)
                    .or_else(|| mask_seats(nb).next());
                if let Some(target) = target {
                    let origin = if m.origin == NONE { m.from } else { m.origin };
                    self.msgs.push(Msg {
                        from: seat as u8,
                        to: target as u8,
                        kind: Kind::Dm,
                        claim: m.claim,
                        conf: (m.conf * 0.9).max(0.05),
                        turn: t,
                        origin,
                        source: Source::Relay,
                        text: NO_TEXT,
                    });
                }
                Action::Wait
            }
            Role::Editor => {
                if t + 1 >= self.spec().max_steps {
                    if let Some(m) = self.most_confident(seat) {
                        let mut r = Report::default();
                        for f in 0..FIELDS {
                            if m.claim[f] < VALUES as u8 {
                                r.values[f] = m.claim[f];
                                r.conf[f] = m.conf;
                            }
                        }
                        return Action::Publish(r);
                    }
                }
                Action::Wait
            }
        }
    }

    /// The newest message `seat` received (DM or broadcast with a claim) whose claim it
    /// has not forwarded yet.
    pub(super) fn relay_candidate(&self, seat: usize) -> Option<usize> {
        (0..self.msgs.len()).rev().find(|&i| {
            let m = &self.msgs[i];
            matches!(m.kind, Kind::Dm | Kind::Broadcast)
                && self.sees(seat, m)
                && claim_nonempty(&m.claim)
                && !self
                    .msgs
                    .iter()
                    .any(|s| s.from as usize == seat && s.kind == Kind::Dm && s.claim == m.claim)
        })
    }

    /// The most confident claim `seat` has received (the oldest among ties).
    pub fn most_confident(&self, seat: usize) -> Option<Msg> {
        let mut best: Option<Msg> = None;
        for m in &self.msgs {
            if matches!(m.kind, Kind::Dm | Kind::Broadcast)
                && self.sees(seat, m)
                && claim_nonempty(&m.claim)
                && best.is_none_or(|b| m.conf > b.conf)
            {
                best = Some(*m);
            }
        }
        best
    }

    /// The newest claim `seat` has received.
    pub fn newest_claim(&self, seat: usize) -> Option<Msg> {
        self.msgs
            .iter()
            .rev()
            .find(|m| {
                matches!(m.kind, Kind::Dm | Kind::Broadcast)
                    && self.sees(seat, m)
                    && claim_nonempty(&m.claim)
            })
            .copied()
    }
}

fn scripted_send(target: u8, claim: Claim, conf: f32) -> Action {
    Action::Send {
        target,
        claim,
        conf,
        source: None,
        text: None,
    }
}
