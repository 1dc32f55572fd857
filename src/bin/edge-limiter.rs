//! `edge-limiter`: the native command beside the worker.
//!
//! - `check [wrangler.toml]` validates every environment's rules;
//! - `simulate [wrangler.toml] --log FILE` replays a request log through them;
//! - `inspect RULE VALUE...` (or `--client SHOWN`) shows where one client
//!   stands on one rule;
//! - `reset RULE VALUE...` forgets that client's state on that rule;
//! - `limit set|get|clear|list RULE [VALUE...]` changes a rule's figures;
//! - `stats [RULE...]` reports what the deployment's isolates recorded.

#[cfg(not(target_arch = "wasm32"))]
mod cli {
    use std::{
        fs::File,
        io::{BufReader, IsTerminal, Write},
        path::{Path, PathBuf},
        process::ExitCode,
        time::{Duration, Instant},
    };

    use clap::{Parser, Subcommand, ValueEnum};
    use edge_limiter::{
        decision::transport::redis_rest::RestClient,
        operator::simulate::{
            self,
            engine::{Engine, ModelEngine, RedisEngine},
            isolates::IsolatesReplay,
            log::Format,
            plot,
        },
        operator::validate::{check_wrangler_toml, describe},
        operator::{inspect, limits, metrics, stats},
        rules::{
            config::{Config, STATS_SECRET},
            overrides::Override,
            policy::MAX_DURATION_MS,
        },
    };
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

    /// Rate-limit rules for the edge-limiter worker: check, simulate, inspect, reset.
    #[derive(Parser)]
    #[command(name = "edge-limiter", version, about, after_help = EXIT_STATUS)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Subcommand)]
    enum Command {
        /// Validate every environment's rules in a wrangler.toml before deploying.
        #[command(after_help = EXIT_STATUS)]
        Check {
            /// The configuration.
            #[arg(default_value = "wrangler.toml")]
            config: PathBuf,
        },
        /// Replay a request log through the rules and report what the worker would have decided.
        #[command(after_help = EXIT_STATUS)]
        Simulate(SimulateArgs),
        /// Show where one client stands on one rule, consuming nothing.
        #[command(after_help = EXIT_STATUS)]
        Inspect(ClientArgs),
        /// Forget one client's state on one rule.
        #[command(after_help = EXIT_STATUS)]
        Reset(ClientArgs),
        /// Change a rule's limits without a redeploy, for every client or one.
        #[command(subcommand, after_help = EXIT_STATUS)]
        Limit(LimitCommand),
        /// Report what the deployment's isolates recorded (with `stats = true`), as simulate reports a log.
        #[command(after_help = EXIT_STATUS)]
        Stats(StatsArgs),
    }

    #[derive(clap::Args)]
    struct StatsArgs {
        /// The rules to report; every rule when none are named.
        #[arg(value_name = "RULE")]
        rules: Vec<String>,
        /// From when: a duration back from now (30m, 1h, 7d) or an RFC 3339 time.
        #[arg(long, value_name = "1h|TIME", default_value = "1h")]
        since: String,
        /// Until when (now when left out): a duration back from now or an RFC 3339 time.
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// Also draw admitted and denied requests over time: FILE.svg, or FILE.html for a page.
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
        /// Instead, serve a page that redraws itself every few seconds over the last
        /// --since (read only; on 127.0.0.1:8790 unless ADDR says where).
        #[arg(
            long,
            value_name = "ADDR",
            num_args = 0..=1,
            default_missing_value = "127.0.0.1:8790",
            conflicts_with_all = ["until", "plot", "json"]
        )]
        serve: Option<String>,
        /// Instead, print the counters Prometheus scrapes from --serve's /metrics
        /// (every figure since the isolates began writing; --since and --until do not apply).
        #[arg(long, value_enum, value_name = "FORMAT", conflicts_with_all = ["serve", "plot", "json"])]
        format: Option<StatsFormat>,
        #[command(flatten)]
        from: Deployment,
    }

    #[derive(Subcommand)]
    enum LimitCommand {
        /// Put figures, or a block, in place of the rule's: for the client the
        /// values name, or for every client when none are given.
        #[command(after_help = EXIT_STATUS)]
        Set(LimitSetArgs),
        /// Show the override for the client the values name (every client: none).
        #[command(after_help = EXIT_STATUS)]
        Get(LimitArgs),
        /// Remove it: the configured figures hold again.
        #[command(after_help = EXIT_STATUS)]
        Clear(LimitArgs),
        /// Every override of the rule in force, with what it replaced and when it ends.
        #[command(after_help = EXIT_STATUS)]
        List(LimitListArgs),
    }

    #[derive(clap::Args)]
    struct LimitArgs {
        /// The rule's name.
        rule: String,
        /// The client's key parts in the rule's order, as the client sends them; none for every client.
        #[arg(value_name = "VALUE")]
        values: Vec<String>,
        #[command(flatten)]
        whom: Shown,
        #[command(flatten)]
        from: Deployment,
    }

    #[derive(clap::Args)]
    struct Shown {
        /// Name the client as `stats` and its page show it (`#…` or `~…` where
        /// the stats keep clients hashed), in place of its key parts.
        #[arg(long = "client", value_name = "SHOWN", conflicts_with = "values")]
        shown: Option<String>,
    }

    impl Shown {
        /// The configuration (`rules_naming` it), its rule `name` to act
        /// through, and the values naming the client: the rule and `values`
        /// as given, or the rule naming clients by their shown form and
        /// that form.
        fn resolve<'v>(
            &'v self,
            from: &Deployment,
            name: &str,
            values: &'v [String],
        ) -> Result<(Config, edge_limiter::rules::rule::Rule, Vec<&'v str>), Failure> {
            let config = from.rules_naming(self)?;
            let rule = inspect::find_rule(&config, name)?;
            let (rule, values) = match &self.shown {
                Some(shown) => (inspect::as_shown(rule, shown)?, vec![shown.as_str()]),
                None => (rule.clone(), values.iter().map(String::as_str).collect()),
            };
            Ok((config, rule, values))
        }
    }

    #[derive(clap::Args)]
    struct LimitListArgs {
        #[command(flatten)]
        target: LimitArgs,
        /// Find the clients' overrides with SCAN (the whole keyspace) rather than
        /// the index `limit set` keeps, and add them to it: once, for overrides
        /// written by a release before the index.
        #[arg(long)]
        scan: bool,
    }

    /// Where the rules and the Redis settings are read, and how answers print.
    #[derive(clap::Args)]
    struct Deployment {
        /// The configuration holding the rule.
        #[arg(long, default_value = "wrangler.toml", value_name = "FILE")]
        config: PathBuf,
        /// Use the rules of `[env.NAME]` instead of the top level.
        #[arg(long, value_name = "NAME")]
        env: Option<String>,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
        /// Reach this region's Redis (`regions` in the configuration), by its
        /// secrets (UPSTASH_REDIS_REST_URL_EU...), rather than the home's.
        #[arg(long, value_name = "NAME")]
        region: Option<String>,
    }

    impl Deployment {
        /// The configuration's rules, as `--config` and `--env` name them,
        /// keyed by `STATS_SECRET` (from the environment or `.dev.vars`) where
        /// `stats_clients = "hmac"` asks for it: every key then reads as the
        /// worker's.
        fn rules(&self) -> Result<Config, Failure> {
            let config = load_config(&self.config, self.env.as_deref())?;
            let dev_vars = std::fs::read_to_string(".dev.vars").ok();
            let secret =
                inspect::setting(|k| std::env::var(k).ok(), dev_vars.as_deref(), STATS_SECRET);
            config
                .keyed_by(secret.as_deref())
                .map_err(|e| Failure::from(e.to_string()))
        }

        /// The rules for acting on the client `whom` names: one named as
        /// shown needs no secret to reach its key.
        fn rules_naming(&self, whom: &Shown) -> Result<Config, Failure> {
            match whom.shown {
                Some(_) => load_config(&self.config, self.env.as_deref()),
                None => self.rules(),
            }
        }
    }

    #[derive(clap::Args)]
    struct LimitSetArgs {
        #[command(flatten)]
        target: LimitArgs,
        /// GCRA: units per period (the rule's own when left out).
        #[arg(long)]
        rate: Option<u64>,
        /// GCRA: the period with its unit, e.g. 1s, 1m (the rule's own when left out).
        #[arg(long, value_name = "DURATION")]
        period: Option<String>,
        /// GCRA: units at once (the rule's own when left out).
        #[arg(long)]
        burst: Option<u64>,
        /// Windows: each window's limit, in the rule's order (once per window).
        #[arg(long = "limit", value_name = "N")]
        limits: Vec<u64>,
        /// Deny the client outright (429, and Retry-After while it lasts).
        #[arg(long, conflicts_with_all = ["rate", "period", "burst", "limits"])]
        block: bool,
        /// How long the override lasts, with its unit (e.g. 30s, 2h, 7d; at most 366d); for ever when left out.
        #[arg(long = "for", value_name = "DURATION")]
        lasting: Option<String>,
    }

    #[derive(clap::Args)]
    struct SimulateArgs {
        /// The configuration whose rules to replay.
        #[arg(default_value = "wrangler.toml")]
        config: PathBuf,
        /// The request log: CSV with a header row, Common/Combined Log Format, or Logpush JSON lines.
        #[arg(long, value_name = "FILE")]
        log: PathBuf,
        /// Use the rules of `[env.NAME]` instead of the top level.
        #[arg(long, value_name = "NAME")]
        env: Option<String>,
        /// The log's format; guessed from its first non-blank line when absent.
        #[arg(long, value_enum)]
        format: Option<LogFormat>,
        /// What decides: the real script on a private redis-server, or the reference model.
        #[arg(long, value_enum, default_value_t = EngineKind::Redis)]
        engine: EngineKind,
        /// Stop with an error at the first line that cannot be read.
        #[arg(long)]
        strict: bool,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
        /// Also draw admitted and denied requests over time: FILE.svg, or FILE.html for a page.
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
        /// Host of requests whose log line names none (the Common Log Format never does).
        #[arg(long, value_name = "HOST", default_value = "")]
        host: String,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        /// Also replay the log through N isolates with the rules' leases, and
        /// report REST calls per request, the requests decided differently,
        /// and whether anything went over a limit.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
        isolates: Option<u16>,
        /// With --isolates: how far from Redis the farthest isolate's calls
        /// travel each way (isolate k of N: k/N of it), so that requests
        /// overlap calls in flight and leases are granted and spent at real
        /// distances.
        #[arg(long, value_name = "MS", requires = "isolates", default_value_t = 0,
              value_parser = clap::value_parser!(u64).range(0..=60_000))]
        latency: u64,
        /// Also replay the log through the configuration's regions, each
        /// with its own Redis and isolates (--isolates in each, else 1),
        /// at the latencies FILE gives between them, one pair a line:
        /// `eu us 80` (ms each way). A line goes to the region its
        /// `cf:colo` or `cf:continent` column (Logpush: EdgeColoCode)
        /// routes it to. Reports calls and far calls per request, and
        /// whether anything went over a limit.
        #[arg(long, value_name = "FILE", conflicts_with = "latency")]
        regions: Option<PathBuf>,
        /// Replay under these overrides: one JSON object a line, e.g.
        /// {"rule": "api", "client": ["key-1"], "rate": 100} (no "client": every client).
        #[arg(long, value_name = "FILE")]
        overrides: Option<PathBuf>,
    }

    #[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
    enum StatsFormat {
        Openmetrics,
    }

    #[derive(Clone, Copy, ValueEnum)]
    enum LogFormat {
        Csv,
        Clf,
        Logpush,
    }

    #[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
    enum EngineKind {
        Redis,
        Model,
    }

    #[derive(clap::Args)]
    struct ClientArgs {
        /// The rule's name.
        rule: String,
        /// The client's key parts in the rule's order, as the client sends them (e.g. its IP).
        #[arg(required_unless_present = "shown", value_name = "VALUE")]
        values: Vec<String>,
        #[command(flatten)]
        whom: Shown,
        #[command(flatten)]
        from: Deployment,
    }

    /// What `--help` says of exit statuses; docs/operator.md says the same.
    const EXIT_STATUS: &str =
        "Exit status: 0 on success; 2 when the command line is wrong in itself \
(what clap reports: an argument missing or unknown, a value it cannot read; and option values \
refused the same way: a duration that cannot be read, figures a rule cannot take such as \
--rate 0); 1 for every other error (a file that cannot be read, a configuration with errors, \
an unknown rule or environment, values that do not fit the rule's key, the Redis endpoint \
refusing or out of reach, a log line --strict stops at).";

    /// A one-line error on stderr, and the exit status it calls for
    /// ([`EXIT_STATUS`]): 1 unless made with [`Failure::usage`].
    struct Failure(String, u8);

    impl Failure {
        /// A command line wrong in itself: exit status 2, as clap's own
        /// usage errors.
        fn usage(message: String) -> Failure {
            Failure(message, 2)
        }
    }

    impl<E: std::fmt::Display> From<E> for Failure {
        fn from(e: E) -> Failure {
            Failure(e.to_string(), 1)
        }
    }

    pub fn main() -> ExitCode {
        let cli = Cli::parse();
        let result = match cli.command {
            Command::Check { config } => return check(&config),
            Command::Simulate(args) => simulate(args),
            Command::Inspect(args) => client_command(args, false),
            Command::Reset(args) => client_command(args, true),
            Command::Limit(command) => limit_command(command),
            Command::Stats(args) => stats_command(args),
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(Failure(message, code)) => {
                eprintln!("edge-limiter: {message}");
                ExitCode::from(code)
            }
        }
    }

    fn check(path: &Path) -> ExitCode {
        let shown = path.display();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{shown}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let verdicts = match check_wrangler_toml(&text) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("{shown}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut ok = true;
        for (env, verdict) in verdicts {
            match verdict {
                Ok(config) => {
                    println!("{shown} [{env}]: ok");
                    for line in describe(&config) {
                        println!("  {line}");
                    }
                }
                Err(e) => {
                    ok = false;
                    eprintln!("{shown} [{env}]: {e}");
                }
            }
        }
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }

    /// The configuration of one environment (`None`: the top level).
    fn load_config(path: &Path, env: Option<&str>) -> Result<Config, Failure> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
        let verdicts = check_wrangler_toml(&text).map_err(|e| format!("{shown}: {e}"))?;
        let wanted = env.map_or("(top level)".to_owned(), |e| format!("env.{e}"));
        let envs: Vec<String> = verdicts.iter().map(|(name, _)| name.clone()).collect();
        let (_, verdict) = verdicts
            .into_iter()
            .find(|(name, _)| *name == wanted)
            .ok_or_else(|| format!("{shown} has no [{wanted}]; it has {}", envs.join(", ")))?;
        verdict.map_err(|e| Failure::from(format!("{shown} [{wanted}]: {e}")))
    }

    fn simulate(args: SimulateArgs) -> Result<(), Failure> {
        let config = load_config(&args.config, args.env.as_deref())?.readable_keys();
        let shown = args.log.display().to_string();
        let file = File::open(&args.log).map_err(|e| format!("{shown}: {e}"))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let options = simulate::Options {
            format: args.format.map(|f| match f {
                LogFormat::Csv => Format::Csv,
                LogFormat::Clf => Format::Clf,
                LogFormat::Logpush => Format::Logpush,
            }),
            host: args.host.to_ascii_lowercase(),
            strict: args.strict,
        };
        let planned = match &args.overrides {
            Some(path) => {
                let shown = path.display();
                let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
                limits::plan(&config, &text).map_err(|e| format!("{shown}: {e}"))?
            }
            None => vec![],
        };
        let mut engine: Box<dyn Engine> = match args.engine {
            EngineKind::Redis => Box::new(RedisEngine::start()?),
            EngineKind::Model => Box::new(ModelEngine::new()),
        };
        engine.set_overrides(&planned)?;
        let mut heard = Heard {
            progress: Progress::new(size, args.quiet),
            isolates: match &args.regions {
                Some(path) => {
                    let shown = path.display();
                    let text =
                        std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
                    let distances = simulate::distances::Distances::read(&text, &config.regions)
                        .map_err(|e| format!("{shown}: {e}"))?;
                    let each = args.isolates.map_or(1, usize::from);
                    Some(IsolatesReplay::across_regions(&config, each, &distances)?)
                }
                None => args
                    .isolates
                    .map(|n| IsolatesReplay::start(&config, n.into(), args.latency))
                    .transpose()?,
            },
        };
        if let Some(isolates) = &mut heard.isolates {
            isolates.set_overrides(&planned)?;
        }
        let report = simulate::simulate(
            &config,
            BufReader::with_capacity(1 << 20, file),
            &options,
            engine.as_mut(),
            &mut heard,
        );
        heard.progress.finish();
        // The private redis-servers stop here, before anything is printed.
        drop(engine);
        let isolates = heard.isolates.map(IsolatesReplay::finish);
        let report = report?;
        if let Some(path) = &args.plot {
            write_plot(path, &report, &shown, None)?;
        }
        let mut out = std::io::stdout().lock();
        let text = if args.json {
            let mut json = report.to_json();
            if let Some(isolates) = &isolates {
                json["isolates"] = serde_json::to_value(isolates).unwrap_or_default();
            }
            format!("{json}\n")
        } else {
            let extra = isolates.map(|i| i.render_text()).unwrap_or_default();
            let under = match planned.len() {
                0 => String::new(),
                n => format!(
                    "under {n} override(s) from {}\n",
                    args.overrides
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ),
            };
            format!("{under}{}{extra}", report.render_text(&shown))
        };
        out.write_all(text.as_bytes())?;
        Ok(())
    }

    /// Writes `report`'s plot to `path`: a page with the table when it ends
    /// in `.html`, else an SVG.
    fn write_plot(
        path: &Path,
        report: &simulate::report::Report,
        source: &str,
        counting_at: Option<u64>,
    ) -> Result<(), Failure> {
        let is_html = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm"));
        let look = plot::Look::file(counting_at);
        let page = if is_html {
            plot::html(report, source, look)?
        } else {
            plot::svg(report, look)?
        };
        std::fs::write(path, page).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(())
    }

    /// A moment given to `option`: an RFC 3339 time, or a duration back
    /// from `now_ms`.
    fn moment(option: &str, text: &str, now_ms: u64) -> Result<u64, Failure> {
        if let Some(ms) = simulate::clock::rfc3339_ms(text) {
            return Ok(ms);
        }
        let back = text
            .parse::<u64>()
            .ok()
            .or_else(|| edge_limiter::rules::fields::duration_text(text))
            .ok_or_else(|| {
                Failure::usage(format!(
                    "{option}: `{text}` is neither a duration (30m, 1h, 7d) nor an RFC 3339 time \
                     (2026-11-20T10:00:00Z)"
                ))
            })?;
        Ok(now_ms.saturating_sub(back))
    }

    fn stats_command(args: StatsArgs) -> Result<(), Failure> {
        // The stats show clients as the keys do: no secret is needed to read them.
        let config = load_config(&args.from.config, args.from.env.as_deref())?;
        let rules = stats::selected(&config, &args.rules)?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let since_ms = moment("--since", &args.since, now_ms)?;
        let until_ms = match &args.until {
            Some(until) => moment("--until", until, now_ms)?,
            None => now_ms,
        };
        if since_ms >= until_ms {
            return Err(Failure::usage(
                "--since must come before --until (and before now)".into(),
            ));
        }
        let (client, runtime) = connect(&args.from, &config)?;
        // Each region's isolates write in their own Redis: without
        // --region, every region's is read and the figures added up.
        let mut clients = vec![client];
        if args.from.region.is_none() {
            for at in 1..config.regions.len() {
                clients.push(client_of(&config, at)?);
            }
        }
        if args.format == Some(StatsFormat::Openmetrics) {
            let counters = runtime.block_on(metrics::scrape_all(&clients, &rules, now_ms))?;
            let flavor = metrics::Flavor::OpenMetrics;
            let text = metrics::exposition(&counters, now_ms, flavor);
            std::io::stdout().lock().write_all(text.as_bytes())?;
            return Ok(());
        }
        if let Some(addr) = &args.serve {
            let listener =
                std::net::TcpListener::bind(addr).map_err(|e| format!("--serve {addr}: {e}"))?;
            let shown = listener.local_addr()?;
            println!("edge-limiter stats: serving http://{shown}/ (read only; Ctrl-C stops)");
            let window_ms = until_ms - since_ms;
            let mut live =
                edge_limiter::operator::live::Live::new(&config, rules, &clients, window_ms);
            live.serve(&listener, &runtime)?;
            return Ok(());
        }
        let span = stats::Span { since_ms, until_ms };
        let recorded = runtime.block_on(stats::read_all(&clients, &rules, span))?;
        let source = match clients.len() {
            1 => format!("stats in {}", clients[0].url().trim_end_matches('/')),
            _ => {
                let names: Vec<&str> = config.regions.iter().map(|r| r.name.as_str()).collect();
                format!("stats in the Redis of regions {}", names.join(", "))
            }
        };
        if config.stats.is_none() {
            eprintln!(
                "edge-limiter: note: this configuration keeps no stats; `stats = true` in \
                 [vars.LIMITER] turns them on"
            );
        }
        let report = stats::report(&config, span, &recorded);
        if let Some(path) = &args.plot {
            write_plot(path, &report, &source, Some(now_ms))?;
        }
        let text = match args.from.json {
            true => format!("{}\n", report.to_json()),
            false => report.render_text(&source),
        };
        std::io::stdout().lock().write_all(text.as_bytes())?;
        Ok(())
    }

    /// What hears the simulation: the progress bar, and the lease replay
    /// when `--isolates` asks for one.
    struct Heard<'c> {
        progress: Progress,
        isolates: Option<IsolatesReplay<'c>>,
    }

    impl simulate::Observer for Heard<'_> {
        fn progress(&mut self, bytes: u64) {
            self.progress.progress(bytes);
        }

        fn verdict(&mut self, record: &simulate::log::Record, verdict: simulate::Replayed<'_>) {
            if let Some(isolates) = &mut self.isolates {
                isolates.verdict(record, verdict);
            }
        }
    }

    /// A progress bar on stderr over the log's bytes, shown only when stderr
    /// is a terminal and the run has lasted a second.
    struct Progress {
        bar: Option<ProgressBar>,
        started: Instant,
    }

    impl Progress {
        fn new(size: u64, quiet: bool) -> Progress {
            let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
                let bar = ProgressBar::with_draw_target(Some(size), ProgressDrawTarget::hidden());
                if let Ok(style) = ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:40}] {bytes}/{total_bytes} ({eta} left)",
                ) {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar
            });
            Progress {
                bar,
                started: Instant::now(),
            }
        }

        fn finish(&self) {
            if let Some(bar) = &self.bar {
                bar.finish_and_clear();
            }
        }
    }

    impl simulate::Observer for Progress {
        fn progress(&mut self, bytes: u64) {
            if let Some(bar) = &self.bar {
                if bar.is_hidden() && self.started.elapsed() > Duration::from_secs(1) {
                    bar.set_draw_target(ProgressDrawTarget::stderr());
                }
                bar.set_position(bytes);
            }
        }
    }

    /// A duration option written with its unit (`500ms`, `30s`, `2h`,
    /// `1d`), from 1 ms to 366 days, naming the option. A number alone is
    /// refused: `--for 3600` reads as seconds to some and as ms to others.
    fn duration_option(option: &str, text: &str) -> Result<u64, Failure> {
        edge_limiter::rules::fields::duration_text(text)
            .filter(|ms| (1..=MAX_DURATION_MS).contains(ms))
            .ok_or_else(|| {
                Failure::usage(format!(
                    "{option}: `{text}` is not a duration from 1ms to 366d with its unit; write e.g. 500ms, 30s, 2h or 1d"
                ))
            })
    }

    fn limit_command(command: LimitCommand) -> Result<(), Failure> {
        let args = match &command {
            LimitCommand::Set(set) => &set.target,
            LimitCommand::Get(a) | LimitCommand::Clear(a) => a,
            LimitCommand::List(list) => &list.target,
        };
        let (config, rule, values) = args.whom.resolve(&args.from, &args.rule, &args.values)?;
        let rule = &rule;
        // Wrong figures or values fail before any setting is needed.
        limits::key_for(rule, &values)?;
        let what = match &command {
            LimitCommand::Set(set) => Some(override_of(rule, set)?),
            _ => None,
        };
        let lasting = match &command {
            LimitCommand::Set(set) => set
                .lasting
                .as_deref()
                .map(|d| duration_option("--for", d))
                .transpose()?,
            _ => None,
        };
        let (client, runtime) = connect(&args.from, &config)?;
        let found: Vec<limits::Stored> = match (&command, what) {
            (LimitCommand::Set(_), Some(what)) => {
                vec![runtime.block_on(limits::set(&client, rule, &values, &what, lasting))?]
            }
            (LimitCommand::Clear(_), _) => {
                let removed = runtime.block_on(limits::clear(&client, rule, &values))?;
                let text = match (args.from.json, removed) {
                    (true, _) => format!("{}\n", serde_json::json!({ "removed": removed })),
                    (false, true) => "removed; the configured figures hold again\n".to_owned(),
                    (false, false) => "there was no override\n".to_owned(),
                };
                std::io::stdout().lock().write_all(text.as_bytes())?;
                return Ok(());
            }
            (LimitCommand::List(list), _) => {
                runtime.block_on(limits::list(&client, rule, list.scan))?
            }
            _ => runtime
                .block_on(limits::get(&client, rule, &values))?
                .into_iter()
                .collect(),
        };
        // A client with none of its own is under the rule's, if any.
        let rule_wide = match (&command, found.is_empty(), values.is_empty()) {
            (LimitCommand::Get(_), true, false) => {
                runtime.block_on(limits::get(&client, rule, &[]))?
            }
            _ => None,
        };
        let text = if args.from.json {
            let all: Vec<serde_json::Value> = found.iter().map(limits::Stored::to_json).collect();
            format!("{}\n", serde_json::Value::Array(all))
        } else if let Some(wide) = rule_wide {
            format!(
                "no override of its own; every client's holds: {}\n",
                wide.render(&rule.policy)
            )
        } else if found.is_empty() {
            format!(
                "rule `{}`: no override; {} holds\n",
                rule.name,
                rule.policy.described().figures()
            )
        } else {
            found
                .iter()
                .map(|s| s.render(&rule.policy) + "\n")
                .collect()
        };
        std::io::stdout().lock().write_all(text.as_bytes())?;
        Ok(())
    }

    /// The override `set` asks for, checked as the configuration's figures are.
    fn override_of(
        rule: &edge_limiter::rules::rule::Rule,
        set: &LimitSetArgs,
    ) -> Result<Override, Failure> {
        let refuse = |e: edge_limiter::rules::fields::FieldError| {
            Failure::usage(format!(
                "rule `{}`, field `{}`: {}",
                rule.name, e.field, e.problem
            ))
        };
        if set.block {
            return Ok(Override::Block);
        }
        let mut given = serde_json::Map::new();
        let period = set
            .period
            .as_deref()
            .map(|p| duration_option("--period", p))
            .transpose()?;
        for (name, figure) in [("rate", set.rate), ("period", period), ("burst", set.burst)] {
            if let Some(n) = figure {
                given.insert(name.into(), n.into());
            }
        }
        if !set.limits.is_empty() {
            given.insert("limits".into(), set.limits.clone().into());
        }
        if given.is_empty() {
            return Err(Failure::usage(
                "give the figures: --rate, --period, --burst (GCRA), --limit per window, or --block".into(),
            ));
        }
        Override::changed(rule, &given).map_err(refuse)
    }

    /// A client for the REST endpoint of the region `--region` names in
    /// `config` (the home's unless given), and a runtime to run its calls on.
    fn connect(
        from: &Deployment,
        config: &Config,
    ) -> Result<(RestClient, tokio::runtime::Runtime), Failure> {
        let regions = &config.regions;
        let at = match &from.region {
            None => 0,
            Some(name) => edge_limiter::rules::regions::named(regions, name).ok_or_else(|| {
                let known: Vec<&str> = regions.iter().map(|r| r.name.as_str()).collect();
                Failure::from(format!(
                    "--region {name}: the configuration's regions are: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ))
            })?,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok((client_of(config, at)?, runtime))
    }

    /// A client for region `at`'s REST endpoint (0: the home's), by the
    /// settings its secrets name in the environment or `.dev.vars` here.
    fn client_of(config: &Config, at: usize) -> Result<RestClient, Failure> {
        let (url_var, token_var) = edge_limiter::rules::regions::secrets(&config.regions, at);
        let dev_vars = std::fs::read_to_string(".dev.vars").ok();
        let (url, token) = inspect::settings(
            |k| std::env::var(k).ok(),
            dev_vars.as_deref(),
            (&url_var, &token_var),
        )?;
        Ok(RestClient::new(&url, &token)?)
    }

    fn client_command(args: ClientArgs, reset: bool) -> Result<(), Failure> {
        let (config, rule, values) = args.whom.resolve(&args.from, &args.rule, &args.values)?;
        let rule = &rule;
        // Wrong values fail before any setting is needed.
        inspect::identifier(rule, &values)?;
        let (client, runtime) = connect(&args.from, &config)?;
        let text = if reset {
            let removed = runtime.block_on(inspect::reset(&client, rule, &values))?;
            if args.from.json {
                format!("{}\n", removed.to_json())
            } else {
                removed.render()
            }
        } else {
            let mut standing = runtime.block_on(inspect::inspect(&client, rule, &values))?;
            // A shared rule's state is the home's; each other region holds a pool of it.
            if rule.shared.is_some() && args.from.region.is_none() {
                for (at, region) in config.regions.iter().enumerate().skip(1) {
                    let near = client_of(&config, at)?;
                    let pool = inspect::pool_in(&near, &region.name, &standing.key);
                    let pool = runtime.block_on(pool)?;
                    standing.pools.push(pool);
                }
            }
            if args.from.json {
                format!("{}\n", standing.to_json())
            } else {
                standing.render()
            }
        };
        std::io::stdout().lock().write_all(text.as_bytes())?;
        Ok(())
    }
}

/// A replay allocates and frees per request: mimalloc keeps that off the
/// profile, where glibc's malloc took a third of `simulate`'s time.
#[cfg(not(target_arch = "wasm32"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(not(target_arch = "wasm32"))]
fn main() -> std::process::ExitCode {
    cli::main()
}

// The worker's build compiles every target for wasm32; this command is native only.
#[cfg(target_arch = "wasm32")]
fn main() {}
