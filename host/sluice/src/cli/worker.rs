//! `sluice worker`: the reference worker: the embeddable worker client with a synthetic
//! executor, or with `--vectors` a vector shard worker answering `vector.search` children,
//! until SIGTERM or SIGINT, after which it finishes what it holds.

use anyhow::Context;
use sluice::vector::{ShardIndex, ShardPart, VectorExecutor, read_vectors};
use sluice_client::BatchRequest;
use sluice_client::worker::synthetic::Synthetic;
use sluice_client::worker::{WorkerConfig, run};
use sluice_engine::{COLLECTION_LABEL, SHARD_LABEL};
use sluice_model::{FailureClass, Gpu, Heartbeat, LoadedModel, ShardAnnouncement};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    server: super::tasks::ServerArg,
    /// This worker's id (letters, digits and . _ - : / @)
    #[arg(long)]
    id: String,
    /// GPUs this worker offers (0: a CPU worker, for tasks that need no GPU memory)
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// Memory of each GPU, in MB
    #[arg(long, default_value_t = 16_384)]
    gpu_memory_mb: u64,
    /// Models held loaded in GPU memory, as name:gpu:memory_mb,... (e.g. seg-v3:0:6000):
    /// tasks naming one in `resources.model` come here first
    #[arg(long, value_delimiter = ',', value_parser = parse_loaded_model)]
    loaded_models: Vec<LoadedModel>,
    /// Hold each model a task names loaded once it has run there, and say so in heartbeats
    /// (a synthetic model load: nothing is unloaded)
    #[arg(long)]
    learn_models: bool,
    /// Labels tasks may require, as k=v,k2=v2
    #[arg(long, value_parser = parse_labels, default_value = "")]
    labels: BTreeMap<String, String>,
    /// Attempts run at once, spread over the GPUs: each GPU takes up to
    /// max-concurrency / gpus of them (rounded up) while its memory lasts [default: the number
    /// of GPUs, at least 1]
    #[arg(long)]
    max_concurrency: Option<u32>,
    /// How long each synthetic attempt takes, in ms, unless its payload names `exec_ms`
    /// [default: 50]; with --vectors, a delay
    /// added before each search [default: 0]
    #[arg(long)]
    exec_ms: Option<u64>,
    /// The share of attempts that fail, 0 to 1
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// Claim GPU batches of up to this many tasks of one kind, model and batch key, each run
    /// as one call on one GPU (max-concurrency then defaults to gpus × this)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64), conflicts_with = "vectors")]
    batch_size: Option<u32>,
    /// With --batch-size: how long a batch short of its size may wait for more tasks, counted
    /// from its oldest task's arrival (the server's batch_wait_ms caps it per bucket)
    #[arg(long, default_value_t = 20, requires = "batch_size")]
    batch_wait_ms: u64,
    /// With --batch-size: only tasks of these models, comma-separated [default: any]
    #[arg(long, value_delimiter = ',', requires = "batch_size")]
    batch_models: Vec<String>,
    /// With --batch-size: what each task past the first adds to a synthetic batch's time, as a
    /// share of one task's (a batch of n takes exec-ms × (1 + alpha × (n − 1)))
    #[arg(
        long,
        default_value_t = 0.1,
        requires = "batch_size",
        allow_negative_numbers = true
    )]
    batch_alpha: f64,
    /// The class of the synthetic failures
    #[arg(long, value_parser = parse_class, default_value = "transient")]
    fail_class: FailureClass,
    /// Seed of the synthetic failures
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Task kinds this worker runs, comma-separated [default: any; with --vectors:
    /// vector.search]
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Be a vector shard worker over this float32 set (.fvecs or .npy; ids are row numbers)
    #[arg(long)]
    vectors: Option<PathBuf>,
    /// With --vectors: hold only stored shard I of N (a contiguous run of rows) and answer
    /// shard-list children for it; without it, hold the whole set and answer id-range,
    /// id-hash and IVF children
    #[arg(long, value_parser = ShardPart::parse, requires = "vectors")]
    shard: Option<ShardPart>,
    /// With --vectors: IVF centroids (.fvecs or .npy), the same as the split-ivf policy's
    #[arg(long, requires = "vectors")]
    centroids: Option<PathBuf>,
    /// With --vectors: the collection these vectors belong to; searches name it (`collection`
    /// in the query) or search `default`
    #[arg(long, requires = "vectors", default_value = sluice_model::DEFAULT_COLLECTION,
          value_parser = parse_collection)]
    collection: String,
}

fn parse_collection(text: &str) -> Result<String, String> {
    sluice_model::check_collection_name(text)
        .map(|()| text.to_owned())
        .map_err(|e| e.to_string())
}

fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("`{pair}` is not k=v"))
        })
        .collect()
}

fn parse_loaded_model(text: &str) -> Result<LoadedModel, String> {
    // From the right, so a model's name may hold colons itself.
    let mut parts = text.rsplitn(3, ':');
    let (Some(memory_mb), Some(gpu), Some(name)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("`{text}` is not name:gpu:memory_mb"));
    };
    Ok(LoadedModel {
        name: name.to_owned(),
        gpu: gpu
            .parse()
            .map_err(|_| format!("`{gpu}` is not a GPU index"))?,
        memory_mb: memory_mb
            .parse()
            .map_err(|_| format!("`{memory_mb}` is not a size in MB"))?,
    })
}

fn parse_class(text: &str) -> Result<FailureClass, String> {
    FailureClass::ALL
        .into_iter()
        .filter(|class| *class != FailureClass::LeaseExpired)
        .find(|class| class.as_str() == text)
        .ok_or_else(|| {
            format!(
                "`{text}` is not one of transient, node-busy, timeout, permanent, invalid-input"
            )
        })
}

pub async fn run_worker(args: WorkerArgs) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.fail_rate) {
        anyhow::bail!("--fail-rate must be 0 to 1");
    }
    if !(0.0..=10.0).contains(&args.batch_alpha) {
        anyhow::bail!("--batch-alpha must be 0 to 10");
    }
    if args.batch_wait_ms > sluice_engine::MAX_BATCH_WAIT_MS {
        anyhow::bail!(
            "--batch-wait-ms must be at most {}",
            sluice_engine::MAX_BATCH_WAIT_MS
        );
    }
    if args.batch_models.len() > sluice_engine::MAX_BATCH_MODELS {
        anyhow::bail!(
            "--batch-models may name at most {} models",
            sluice_engine::MAX_BATCH_MODELS
        );
    }
    for model in &args.batch_models {
        sluice_model::check_name("batch model", model).context("--batch-models")?;
    }
    let batch_places = args.batch_size.unwrap_or(1);
    if let (Some(size), Some(max)) = (args.batch_size, args.max_concurrency)
        && max < size
    {
        anyhow::bail!(
            "--max-concurrency {max} is below --batch-size {size}: a batch takes a place for \
             each task (leave --max-concurrency out for gpus × batch size)"
        );
    }
    sluice_model::check_worker_id(&args.id).context("--id")?;
    let mut heartbeat = Heartbeat {
        gpus: (0..args.gpus)
            .map(|_| Gpu {
                model: "synthetic".into(),
                memory_mb: args.gpu_memory_mb,
                free: true,
            })
            .collect(),
        labels: args.labels.clone(),
        kinds: args.kinds.clone(),
        max_concurrency: args
            .max_concurrency
            .unwrap_or((args.gpus.max(1) as u32).saturating_mul(batch_places)),
        queue_depth: 0,
        loaded_models: args.loaded_models.clone(),
        vectors: None,
    };
    let client = args.server.client()?;
    let shutdown = super::serve::shutdown_signal();
    let mut gpu_time = String::new();
    let stats = match &args.vectors {
        Some(path) => {
            let index = load_index(path, args.shard, args.centroids.as_deref())?;
            heartbeat
                .labels
                .insert(SHARD_LABEL.to_owned(), index.routing());
            heartbeat
                .labels
                .insert(COLLECTION_LABEL.to_owned(), args.collection.clone());
            let (shard, shards) = index.shard_of();
            heartbeat.vectors = Some(ShardAnnouncement {
                collection: args.collection.clone(),
                shard,
                shards,
                dim: index.dim as u32,
                vectors: index.len() as u64,
            });
            if heartbeat.kinds.is_empty() {
                heartbeat.kinds.push("vector.search".to_owned());
            }
            heartbeat.validate().context("worker settings")?;
            tracing::info!(worker = %args.id, server = %args.server.server, collection = %args.collection, vectors = index.len(), holds = %index.holds(), "vector worker started");
            let executor = Arc::new(VectorExecutor {
                index: Arc::new(index),
                delay_ms: args.exec_ms.unwrap_or(0),
            });
            let config = WorkerConfig::new(args.id.clone(), heartbeat);
            run(client, config, executor, shutdown).await?
        }
        None => {
            heartbeat.validate().context("worker settings")?;
            let mut config = WorkerConfig::new(args.id.clone(), heartbeat);
            config.batch = args.batch_size.map(|size| BatchRequest {
                max_size: size as usize,
                max_wait_ms: args.batch_wait_ms,
                models: args.batch_models.clone(),
            });
            let mut executor = Synthetic::new(
                args.id.clone(),
                args.exec_ms.unwrap_or(50),
                args.fail_rate,
                args.fail_class,
                args.seed,
            );
            if args.learn_models {
                executor.learns_models = Some(config.loaded_models.clone());
            }
            executor.batch_alpha = args.batch_alpha;
            let executor = Arc::new(executor);
            tracing::info!(worker = %args.id, server = %args.server.server, "worker started");
            let stats = run(client, config, executor.clone(), shutdown).await?;
            let busy_s = executor.gpu_busy().as_secs_f64();
            let completed = stats.completed.load(std::sync::atomic::Ordering::Relaxed);
            if busy_s > 0.0 && args.gpus > 0 {
                gpu_time = format!(
                    "; GPU busy {busy_s:.3} s, {:.1} tasks per GPU-second",
                    completed as f64 / busy_s
                );
            }
            stats
        }
    };
    // One line, which scripts and tests read.
    outln!("worker {}: {}{gpu_time}", args.id, stats.line())?;
    Ok(())
}

/// The part of the vector set this worker holds, with IVF lists when centroids are given.
fn load_index(
    path: &std::path::Path,
    shard: Option<ShardPart>,
    centroids: Option<&std::path::Path>,
) -> anyhow::Result<ShardIndex> {
    let vectors = read_vectors(path).context("--vectors")?;
    let index = ShardIndex::from_rows(&vectors, shard);
    match centroids {
        Some(path) => {
            let centroids = read_vectors(path).context("--centroids")?;
            index.with_lists(&centroids).context("--centroids")
        }
        None => Ok(index),
    }
}
