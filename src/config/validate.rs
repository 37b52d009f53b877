//! Range and consistency checks of a parsed [`Config`]: every error names its
//! `section.key` (the caller adds the file and line).
use super::*;

impl Config {
    /// Range and consistency checks (written as `!(x > 0.0)` so NaN fails too).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub(super) fn validate(&self) -> std::result::Result<(), ValidationError> {
        let err = |section: &str, key: &str, msg: String| ValidationError {
            key: Some((section.to_string(), key.to_string())),
            message: format!("{section}.{key}: {msg}"),
        };
        let r = &self.run;
        if r.name.trim().is_empty()
            || r.name.contains(['/', '\\', '\0'])
            || r.name.trim() == "."
            || r.name.trim() == ".."
        {
            return Err(err(
                "run",
                "name",
                format!("`{}` must be a plain non-empty directory name", r.name),
            ));
        }
        if r.steps == 0 {
            return Err(err("run", "steps", "must be >= 1".into()));
        }
        if r.steps > limits::MAX_STEPS {
            return Err(err(
                "run",
                "steps",
                format!("{} exceeds the limit of {}", r.steps, limits::MAX_STEPS),
            ));
        }
        if self.stages.len() > limits::MAX_STAGES {
            return Err(ValidationError {
                key: None,
                message: format!(
                    "{} [[stage]] tables exceed the limit of {}",
                    self.stages.len(),
                    limits::MAX_STAGES
                ),
            });
        }
        // A stage in episode mode checks these against its own resolved config.
        let any_episode_stage = self
            .stages
            .iter()
            .any(|s| s.mode == Some(super::EnvMode::Episode));
        let any_decision_stage = self
            .stages
            .iter()
            .any(|s| s.mode == Some(super::EnvMode::Decision));
        if self.env.as_ref().is_some_and(|e| {
            e.is_episode() && !e.continue_with.is_scripted() && !any_decision_stage
        }) {
            return Err(err(
                "env",
                "continue_with",
                "applies to mode = \"decision\" only (an episode is played by the model already)"
                    .into(),
            ));
        }
        if self.env.as_ref().is_some_and(|e| e.is_episode()) {
            if self.grpo.dynamic_sampling {
                return Err(err(
                    "env",
                    "mode",
                    "`episode` does not combine with grpo.dynamic_sampling yet".into(),
                ));
            }
        } else if let Some(env) = self.env.as_ref().filter(|_| !any_episode_stage) {
            for (key, set) in [
                ("shaped_rewards", env.shaped_rewards),
                ("max_turn_tokens", env.max_turn_tokens > 0),
            ] {
                if set {
                    return Err(err("env", key, "applies to mode = \"episode\" only".into()));
                }
            }
        }
        let m = &self.model;
        if m.name.trim().is_empty() {
            return Err(ValidationError {
                key: None,
                message: "model.name is required: a local directory or .gguf file (with \
                          model.init_tiny = true, a directory for a tiny random model)"
                    .into(),
            });
        }
        if let Err(e) = parse_device_name(&m.device) {
            return Err(err("model", "device", e.to_string()));
        }
        let l = &self.lora;
        if l.r == 0 {
            return Err(err("lora", "r", "must be >= 1".into()));
        }
        if l.r > limits::MAX_LORA_R {
            return Err(err(
                "lora",
                "r",
                format!("{} exceeds the limit of {}", l.r, limits::MAX_LORA_R),
            ));
        }
        if !(l.alpha > 0.0) || !l.alpha.is_finite() {
            return Err(err("lora", "alpha", format!("{} must be > 0", l.alpha)));
        }
        if !(0.0..1.0).contains(&l.dropout) {
            return Err(err(
                "lora",
                "dropout",
                format!("{} must be in [0, 1)", l.dropout),
            ));
        }
        if l.targets.is_empty() {
            return Err(err(
                "lora",
                "targets",
                "must name at least one module".into(),
            ));
        }
        for t in &l.targets {
            if !LORA_TARGETS.contains(&t.as_str()) {
                return Err(err(
                    "lora",
                    "targets",
                    format!("unknown module `{t}`; known: {}", LORA_TARGETS.join(", ")),
                ));
            }
        }
        let g = &self.grpo;
        if g.num_generations < 2 {
            return Err(err(
                "grpo",
                "num_generations",
                format!(
                    "{} must be >= 2 (advantages compare completions within a group)",
                    g.num_generations
                ),
            ));
        }
        if g.num_generations > limits::MAX_NUM_GENERATIONS {
            return Err(err(
                "grpo",
                "num_generations",
                format!(
                    "{} exceeds the limit of {}",
                    g.num_generations,
                    limits::MAX_NUM_GENERATIONS
                ),
            ));
        }
        if g.prompts_per_step == 0 {
            return Err(err("grpo", "prompts_per_step", "must be >= 1".into()));
        }
        if g.max_prompt_draws != 0 && g.max_prompt_draws < g.prompts_per_step {
            return Err(err(
                "grpo",
                "max_prompt_draws",
                format!(
                    "{} is below prompts_per_step = {} (0: 4 x prompts_per_step)",
                    g.max_prompt_draws, g.prompts_per_step
                ),
            ));
        }
        if g.max_prompt_draws > limits::MAX_PROMPTS_PER_STEP {
            return Err(err(
                "grpo",
                "max_prompt_draws",
                format!(
                    "{} exceeds the limit of {}",
                    g.max_prompt_draws,
                    limits::MAX_PROMPTS_PER_STEP
                ),
            ));
        }
        if g.prompts_per_step > limits::MAX_PROMPTS_PER_STEP {
            return Err(err(
                "grpo",
                "prompts_per_step",
                format!(
                    "{} exceeds the limit of {}",
                    g.prompts_per_step,
                    limits::MAX_PROMPTS_PER_STEP
                ),
            ));
        }
        if g.batch_size() > limits::MAX_BATCH_ROWS {
            return Err(err(
                "grpo",
                "prompts_per_step",
                format!(
                    "prompts_per_step x num_generations = {} rows exceeds the limit of {}",
                    g.batch_size(),
                    limits::MAX_BATCH_ROWS
                ),
            ));
        }
        if g.max_completion_length == 0 {
            return Err(err("grpo", "max_completion_length", "must be >= 1".into()));
        }
        if g.max_completion_length > limits::MAX_COMPLETION_LENGTH {
            return Err(err(
                "grpo",
                "max_completion_length",
                format!(
                    "{} exceeds the limit of {} tokens (and must fit the model's \
                     max_position_embeddings)",
                    g.max_completion_length,
                    limits::MAX_COMPLETION_LENGTH
                ),
            ));
        }
        if !(g.temperature > 0.0) || !g.temperature.is_finite() {
            return Err(err(
                "grpo",
                "temperature",
                format!("{} must be > 0", g.temperature),
            ));
        }
        if !(g.top_p > 0.0 && g.top_p <= 1.0) {
            return Err(err(
                "grpo",
                "top_p",
                format!("{} must be in (0, 1] (1 = off)", g.top_p),
            ));
        }
        if !(0.0..=1.0).contains(&g.min_p) {
            return Err(err(
                "grpo",
                "min_p",
                format!("{} must be in [0, 1]", g.min_p),
            ));
        }
        if !(g.repetition_penalty > 0.0) || !g.repetition_penalty.is_finite() {
            return Err(err(
                "grpo",
                "repetition_penalty",
                format!("{} must be > 0", g.repetition_penalty),
            ));
        }
        if !(g.beta >= 0.0) || !g.beta.is_finite() {
            return Err(err("grpo", "beta", format!("{} must be >= 0", g.beta)));
        }
        if !(g.epsilon > 0.0) || !(g.epsilon < 1.0) {
            return Err(err(
                "grpo",
                "epsilon",
                format!("{} must be in (0, 1)", g.epsilon),
            ));
        }
        if let Some(eh) = g.epsilon_high {
            if !(eh > 0.0) || !eh.is_finite() {
                return Err(err("grpo", "epsilon_high", format!("{eh} must be > 0")));
            }
        }
        if let Some(d) = g.delta {
            if !(d > 1.0) || !d.is_finite() {
                return Err(err("grpo", "delta", format!("{d} must be > 1")));
            }
        }
        if g.num_iterations == 0 {
            return Err(err("grpo", "num_iterations", "must be >= 1".into()));
        }
        if g.num_iterations > limits::MAX_NUM_ITERATIONS {
            return Err(err(
                "grpo",
                "num_iterations",
                format!(
                    "{} exceeds the limit of {}",
                    g.num_iterations,
                    limits::MAX_NUM_ITERATIONS
                ),
            ));
        }
        for (k, w) in &g.reward_weights {
            if !w.is_finite() {
                return Err(err(
                    "grpo",
                    "reward_weights",
                    format!("weight of `{k}` must be finite"),
                ));
            }
        }
        self.validate_trl_knobs(g)?;
        let o = &self.optim;
        // AdamW moves every weight by about the learning rate each step: past 1 the
        // adapter is noise after one step, whatever the loss.
        if !(o.learning_rate > 0.0 && o.learning_rate <= 1.0) {
            return Err(err(
                "optim",
                "learning_rate",
                format!("{} must be in (0, 1]", o.learning_rate),
            ));
        }
        if !(o.max_grad_norm >= 0.0) {
            return Err(err(
                "optim",
                "max_grad_norm",
                format!("{} must be >= 0 (0 disables clipping)", o.max_grad_norm),
            ));
        }
        for b in o.betas {
            if !(0.0..1.0).contains(&b) {
                return Err(err("optim", "betas", format!("{b} must be in [0, 1)")));
            }
        }
        if !(o.eps > 0.0) || !o.eps.is_finite() {
            return Err(err("optim", "eps", format!("{} must be > 0", o.eps)));
        }
        if !(o.weight_decay >= 0.0) || !o.weight_decay.is_finite() {
            return Err(err(
                "optim",
                "weight_decay",
                format!("{} must be >= 0", o.weight_decay),
            ));
        }
        if r.eval_every > 0 && r.eval_episodes == 0 {
            return Err(err(
                "run",
                "eval_episodes",
                "0 with eval_every > 0: give the held-out episodes to play (>= 1)".into(),
            ));
        }
        if o.warmup_steps > r.steps {
            return Err(err(
                "optim",
                "warmup_steps",
                format!("{} exceeds run.steps = {}", o.warmup_steps, r.steps),
            ));
        }
        if let Some(gb) = o.memory_budget_gb {
            if !(gb > 0.0) || gb > limits::MAX_MEMORY_BUDGET_GB {
                return Err(err(
                    "optim",
                    "memory_budget_gb",
                    format!(
                        "{gb} must be > 0 and at most {} (GB; leave it unset for a share \
                         of the available memory)",
                        limits::MAX_MEMORY_BUDGET_GB
                    ),
                ));
            }
        }
        if let Some(e) = &self.env {
            self.check_remote(e)?;
        }
        match &self.env {
            Some(e) if e.name.trim().is_empty() && e.url.is_none() => {
                return Err(err(
                    "env",
                    "name",
                    "must name an environment (see `concord envs list`), or give \
                     url = \"ws://host:port\" to train on an OpenEnv server"
                        .into(),
                ))
            }
            // An SFT-only config may have no environment (`concord train` then says so).
            None if self.stages.is_empty() && self.sft.is_none() => {
                return Err(ValidationError {
                    key: None,
                    message: "missing [env] section (or [[stage]] tables)".into(),
                })
            }
            _ => {}
        }
        if let Some(s) = &self.sft {
            s.check(self.env.is_some())
                .map_err(|(key, msg)| err("sft", key, msg))?;
        }
        Ok(())
    }

    /// `[env] url` and the keys that go with it.
    fn check_remote(&self, e: &EnvConfig) -> std::result::Result<(), ValidationError> {
        let err = |key: &str, msg: String| ValidationError {
            key: Some(("env".to_string(), key.to_string())),
            message: format!("env.{key}: {msg}"),
        };
        let Some(spec) = e.remote_spec() else {
            for (key, set) in [
                ("action_key", e.action_key.is_some()),
                ("observation_key", e.observation_key.is_some()),
                ("max_steps", e.max_steps > 0),
                ("timeout", e.timeout.is_some()),
            ] {
                if set {
                    return Err(err(
                        key,
                        "applies with url = \"ws://host:port\" only".into(),
                    ));
                }
            }
            return Ok(());
        };
        if let Err(x) = spec.ws_url() {
            return Err(err("url", format!("{x:#}")));
        }
        // With stages, [env]'s mode is a default: each stage's resolved config checks
        // its own.
        if !e.is_episode() && e.continue_with.is_scripted() && self.stages.is_empty() {
            return Err(err(
                "url",
                "an OpenEnv server has no scripted policy to finish a decision's episode: \
                 add continue_with = \"model\" to [env] (the model plays on), or train \
                 whole episodes with mode = \"episode\""
                    .into(),
            ));
        }
        if !e.options.is_empty() {
            // reported at `url` (a table header has no key line to point at)
            return Err(err(
                "url",
                "[env.options] configure built-in environments; an OpenEnv server takes \
                 its options when it is started (e.g. concord serve NAME --set k=v)"
                    .into(),
            ));
        }
        if let Some(t) = e.timeout {
            if !(t > 0.0 && t <= super::MAX_ENV_TIMEOUT_S) {
                return Err(err(
                    "timeout",
                    format!(
                        "{t} is not a number of seconds in (0, {}]",
                        super::MAX_ENV_TIMEOUT_S
                    ),
                ));
            }
        }
        if spec.action_key.trim().is_empty() {
            return Err(err(
                "action_key",
                "must name the action's text field".into(),
            ));
        }
        Ok(())
    }

    /// The loss, entropy, aggregation and sampler-correction keys of TRL 1.16.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn validate_trl_knobs(&self, g: &GrpoConfig) -> std::result::Result<(), ValidationError> {
        let err = |key: &str, msg: String| ValidationError {
            key: Some(("grpo".to_string(), key.to_string())),
            message: format!("grpo.{key}: {msg}"),
        };
        for (key, v) in [
            ("sapo_temperature_pos", g.sapo_temperature_pos),
            ("sapo_temperature_neg", g.sapo_temperature_neg),
            ("vespo_lambda_pos", g.vespo_lambda_pos),
            ("vespo_lambda_neg", g.vespo_lambda_neg),
        ] {
            if !(v > 0.0) || !v.is_finite() {
                return Err(err(key, format!("{v} must be > 0")));
            }
        }
        for (key, v) in [
            ("vespo_k_pos", g.vespo_k_pos),
            ("vespo_k_neg", g.vespo_k_neg),
        ] {
            if !(v >= 0.0) || !v.is_finite() {
                return Err(err(key, format!("{v} must be >= 0")));
            }
        }
        if !(0.0..=1.0).contains(&g.top_entropy_quantile) {
            return Err(err(
                "top_entropy_quantile",
                format!(
                    "{} must be in [0, 1] (1 = every token, 0.2 = the paper's top 20%)",
                    g.top_entropy_quantile
                ),
            ));
        }
        if !g.entropy_coef.is_finite() {
            return Err(err(
                "entropy_coef",
                format!("{} must be finite", g.entropy_coef),
            ));
        }
        let max = g.importance_sampling_clip_max;
        if !(max > 0.0) {
            return Err(err(
                "importance_sampling_clip_max",
                format!("{max} must be > 0 (inf: no upper bound)"),
            ));
        }
        if let Some(min) = g.importance_sampling_clip_min {
            if !(min >= 0.0) || !min.is_finite() {
                return Err(err(
                    "importance_sampling_clip_min",
                    format!("{min} must be a finite value >= 0"),
                ));
            }
            if !(min < max) {
                return Err(err(
                    "importance_sampling_clip_min",
                    format!("{min} must be below importance_sampling_clip_max = {max}"),
                ));
            }
        }
        if let Some(t) = g.off_policy_mask_threshold {
            if !(t >= 0.0) || !t.is_finite() {
                return Err(err(
                    "off_policy_mask_threshold",
                    format!("{t} must be a finite value >= 0 (e.g. 0.5)"),
                ));
            }
        }
        if g.multi_objective_aggregation == MultiObjectiveAggregation::NormalizeThenSum
            && g.reward_weights.is_empty()
        {
            return Err(err(
                "multi_objective_aggregation",
                "normalize_then_sum normalises each named reward component: name them \
                 (and their weights) in grpo.reward_weights"
                    .into(),
            ));
        }
        if g.loss_type == LossType::Vespo
            && g.importance_sampling_correction
            && matches!(
                g.importance_sampling_mode,
                ImportanceSamplingMode::SequenceMask | ImportanceSamplingMode::SequenceTruncate
            )
        {
            return Err(err(
                "importance_sampling_mode",
                "vespo folds per-token importance weights into its sequence weight: use \
                 token_truncate or token_mask with importance_sampling_correction"
                    .into(),
            ));
        }
        Ok(())
    }
}
