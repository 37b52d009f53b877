//! The fixed data of Whispers: claim constants, event templates, roles and the six tasks.

/// Most seats in any task.
pub const MAX_SEATS: usize = 6;
/// Fields per event.
pub const FIELDS: usize = 4;
/// Values per field.
pub const VALUES: usize = 4;
/// An absent field in a claim or report (also "no seat" / "everyone" for a target).
pub const NONE: u8 = u8::MAX;
/// A published value that is not one of the field's four values (always wrong).
pub const OTHER: u8 = u8::MAX - 1;

/// One value index per field; [`NONE`] where the claim says nothing.
pub type Claim = [u8; FIELDS];
/// The empty claim.
pub const EMPTY: Claim = [NONE; FIELDS];

/// Whether a claim names at least one field.
pub fn claim_nonempty(c: &Claim) -> bool {
    c.iter().any(|&v| v < VALUES as u8)
}

/// An event template: four fields with four possible values each.
#[derive(Debug)]
pub struct Template {
    pub kind: &'static str,
    pub fields: [&'static str; FIELDS],
    pub values: [[&'static str; VALUES]; FIELDS],
}

/// The four templates of the original.
pub static TEMPLATES: [Template; 4] = [
    Template {
        kind: "industrial_incident",
        fields: ["location", "incident", "time", "casualties"],
        values: [
            ["Reactor 7", "Reactor 4", "Plant 12-North", "Plant 9-South"],
            [
                "coolant leak",
                "pressure spike",
                "valve failure",
                "fire alarm",
            ],
            ["03:14", "11:42", "16:05", "22:30"],
            ["0", "1", "2", "3"],
        ],
    },
    Template {
        kind: "market_report",
        fields: ["ticker", "movement", "session", "volume"],
        values: [
            ["ACME", "OMNI", "ZETA", "NOVA"],
            ["up 3%", "down 2%", "up 5%", "flat"],
            ["pre-market", "open", "midday", "close"],
            ["light", "average", "heavy", "extreme"],
        ],
    },
    Template {
        kind: "weather_alert",
        fields: ["region", "phenomenon", "severity", "window"],
        values: [
            ["North-7", "Mid-9", "Coastal-3", "Inner-2"],
            ["hailstorm", "flash flood", "heatwave", "cold snap"],
            ["yellow", "orange", "red", "purple"],
            ["06:00-09:00", "12:00-15:00", "18:00-21:00", "00:00-03:00"],
        ],
    },
    Template {
        kind: "logistics_update",
        fields: ["convoy_id", "status", "checkpoint", "eta_shift_min"],
        values: [
            ["C-17", "C-22", "C-31", "C-44"],
            ["delayed", "on-time", "rerouted", "cancelled"],
            ["Alpha", "Bravo", "Charlie", "Delta"],
            ["0", "15", "45", "120"],
        ],
    },
];

/// A seat's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Witness,
    Relay,
    Adversary,
    Editor,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Witness => "witness",
            Role::Relay => "relay",
            Role::Adversary => "adversary",
            Role::Editor => "editor",
        }
    }
    pub fn from_name(s: &str) -> Option<Role> {
        [Role::Witness, Role::Relay, Role::Adversary, Role::Editor]
            .into_iter()
            .find(|r| r.name() == s)
    }
    pub fn honest(self) -> bool {
        self != Role::Adversary
    }
}

/// One task: the graph, roles, noise, budget and step limit of the original.
#[derive(Debug)]
pub struct TaskSpec {
    pub id: &'static str,
    pub name: &'static str,
    pub description: &'static str,
    pub roles: &'static [Role],
    /// Undirected edges.
    pub edges: &'static [(u8, u8)],
    /// The trained seat.
    pub protagonist: u8,
    /// Per-field probability that a witness sees a wrong value.
    pub noise: f64,
    /// Fact-check budget of the protagonist (other seats have none).
    pub budget: u8,
    pub max_steps: u8,
}

use Role::{Adversary as A, Editor as E, Relay as R, Witness as W};

/// The six tasks (t1..t6), exactly as the original defines them.
pub static TASKS: [TaskSpec; 6] = [
    TaskSpec {
        id: "t1",
        name: "Single Relay",
        description: "1 witness -> 1 relay -> 1 editor, no adversary.",
        roles: &[W, R, E],
        edges: &[(0, 1), (1, 2)],
        protagonist: 2,
        noise: 0.10,
        budget: 0,
        max_steps: 8,
    },
    TaskSpec {
        id: "t2",
        name: "Triangulate",
        description: "2 noisy witnesses, 1 relay, 1 editor; the editor must combine them.",
        roles: &[W, W, R, E],
        edges: &[(0, 2), (1, 2), (2, 3), (0, 3), (1, 3)],
        protagonist: 3,
        noise: 0.30,
        budget: 0,
        max_steps: 12,
    },
    TaskSpec {
        id: "t3",
        name: "Spot the Liar",
        description: "2 sources claim to be witnesses; one of them is an adversary. No fact-checks.",
        roles: &[W, A, R, E],
        edges: &[(0, 2), (1, 2), (2, 3), (0, 3), (1, 3)],
        protagonist: 3,
        noise: 0.20,
        budget: 0,
        max_steps: 14,
    },
    TaskSpec {
        id: "t4",
        name: "Cascade Chain",
        description: "5-node line adversary - relay - relay - relay - editor; the protagonist is the middle relay; upstream is the adversary.",
        roles: &[A, R, R, R, E],
        edges: &[(0, 1), (1, 2), (2, 3), (3, 4)],
        protagonist: 2,
        noise: 0.10,
        budget: 1,
        max_steps: 18,
    },
    TaskSpec {
        id: "t5",
        name: "Coalition Under Pressure",
        description: "6 nodes: 1 honest witness, 2 colluding adversaries, 2 relays, 1 editor; fact-check budget 2.",
        roles: &[W, A, A, R, R, E],
        edges: &[(0, 3), (1, 3), (2, 4), (3, 5), (4, 5), (0, 5), (1, 5), (2, 5)],
        protagonist: 5,
        noise: 0.20,
        budget: 2,
        max_steps: 24,
    },
    TaskSpec {
        id: "t6",
        name: "Calibrated Brief",
        description: "6 nodes: 2 very noisy witnesses, 1 adversary, 2 relays, 1 editor; calibration dominates.",
        roles: &[W, W, A, R, R, E],
        edges: &[(0, 3), (1, 4), (2, 4), (3, 5), (4, 5), (0, 5), (1, 5), (2, 5)],
        protagonist: 5,
        noise: 0.35,
        budget: 2,
        max_steps: 24,
    },
];

impl TaskSpec {
    pub fn seats(&self) -> usize {
        self.roles.len()
    }
    /// Neighbours of `seat` as a bit mask.
    pub fn neighbour_mask(&self, seat: usize) -> u16 {
        let mut m = 0u16;
        for &(a, b) in self.edges {
            if a as usize == seat {
                m |= 1 << b;
            }
            if b as usize == seat {
                m |= 1 << a;
            }
        }
        m
    }
    /// Adversary seats as a bit mask.
    pub fn adversary_mask(&self) -> u16 {
        let mut m = 0;
        for (i, r) in self.roles.iter().enumerate() {
            if *r == Role::Adversary {
                m |= 1 << i;
            }
        }
        m
    }
    pub fn has_role(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

/// Index of a task id (`t1`..`t6`).
pub fn task_index(id: &str) -> Option<usize> {
    TASKS.iter().position(|t| t.id == id)
}

/// Seats of a mask, ascending.
pub fn mask_seats(m: u16) -> impl Iterator<Item = usize> {
    (0..16).filter(move |i| m & (1 << i) != 0)
}
