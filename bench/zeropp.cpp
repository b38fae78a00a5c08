// ZeRO++ on emulated nodes (bench/run_zeropp.sh): one variant per run of
// examples/gpt's GPT (blocks are zero::Units) at stage 3, started in every
// node of tools/netns-cluster.sh, measuring over the steps after a warm-up:
//  - the node link's bytes: the first rank of each node reads its
//    namespace's counters of zc0 (the link to the other nodes) and of lo
//    (TCP between ranks of this node, e.g. a gloo group's) from
//    /proc/self/net/dev just before and after the measured steps, so the
//    start-up (store, gloo's connections, the initial broadcast) is left
//    out; frame bytes, the TCP/IP headers included;
//  - the ring-equivalent bytes each rank's collectives counted
//    (zero::comm::CommStats) on the world group, the data-parallel
//    intra-node group (shared memory) and the inter-node group (gloo);
//  - the step time, the slowest rank's per step, median;
//  - the loss of every step, averaged over the ranks (the data depends only
//    on the step and the rank, so every variant sees the same batches).
//
//   bench_zeropp --variant NAME --zero-extra JSON --out FILE.jsonl
//                [--depth 8] [--width 256] [--heads 8] [--context 64] [--micro 4]
//                [--warmup 3] [--steps 30] [--bucket 5e5] [--threads 0 = cores / ranks]
//                [--dtype fp32|bf16] [--link-rate label]
//   bench_zeropp --report FILE.jsonl   (the markdown table and the last-line JSON)
//
// Rank 0 appends one JSON line per run to --out; --report turns the lines
// into the table, the ratios against the variant "stage3" at the same link
// rate, and as its last line one JSON object of the ratios.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/blas_kernels.h"
#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "median.h"
#include "zero/zero.h"

using namespace zero_examples;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

// Bytes received and sent on `dev` in this process's network namespace.
struct DevBytes {
  int64_t rx = 0, tx = 0;
};
DevBytes dev_bytes(const std::string& dev) {
  std::ifstream in("/proc/self/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != dev) continue;
    std::istringstream fields(line.substr(colon + 1));
    int64_t v[9] = {};
    for (auto& x : v) fields >> x;
    return DevBytes{v[0], v[8]};  // receive bytes, then 7 more receive fields, then transmit bytes
  }
  return DevBytes{-1, -1};  // no such device (e.g. not in an emulated node)
}

std::string blas_kernels() {
  const std::string core = zero::blas::loaded_openblas_core();
  return core.empty() && at::hasMKL() ? std::string("mkl") : core;
}

json stats_json(const zero::comm::CommStats& a, const zero::comm::CommStats& b, double steps) {
  return json{{"all_reduce", (b.all_reduce_bytes - a.all_reduce_bytes) / steps},
              {"reduce_scatter", (b.reduce_scatter_bytes - a.reduce_scatter_bytes) / steps},
              {"all_gather", (b.all_gather_bytes - a.all_gather_bytes) / steps},
              {"broadcast", (b.broadcast_bytes - a.broadcast_bytes) / steps},
              {"total", (b.total() - a.total()) / steps}};
}

int run(const zero_bench::Flags& flags) {
  auto world = zero::comm::init_process_group();
  const int rank = world->rank(), N = world->size();
  int64_t threads = flags.num("threads");
  if (threads <= 0) threads = std::max<int64_t>(1, std::thread::hardware_concurrency() / std::max(1, N));
  at::set_num_threads(static_cast<int>(threads));

  Corpus corpus;
  Batcher train(corpus.train_tokens(), BatcherOptions{0, 1});
  GPTOptions o;
  o.vocab_size = corpus.vocab_size();
  o.depth = flags.num("depth");
  o.width = flags.num("width");
  o.heads = flags.num("heads");
  o.context = flags.num("context");
  torch::manual_seed(0);
  GPT model(o);
  const int64_t psi = model->num_parameters();  // before stage 3 partitions the model

  zero_bench::TrainSetup setup;
  setup.stage = 3;
  setup.dtype = flags.str("dtype");
  setup.micro_batch = flags.num("micro");
  setup.reduce_bucket_size = flags.num("bucket");
  std::string config = zero_bench::ds_config(setup);
  const std::string extra = flags.str("zero-extra");
  if (!extra.empty()) {  // into zero_optimization: the config ends with its "}}}"
    config.insert(config.size() - 2, ", " + extra);
  }
  zero::InitOptions init;
  init.group = world;
  auto engine = zero::initialize(zero::Config::from_json(config), model, init);
  const zero::Mesh& mesh = engine.mesh();
  const auto& intra = mesh.dp_intra_node_group();
  const auto& inter = mesh.dp_inter_node_group();
  // The first rank of each node reads the node's counters.
  const bool reader = rank == 0 || world->node(rank) != world->node(rank - 1);

  const int64_t warmup = flags.num("warmup"), steps = flags.num("steps");
  std::vector<double> times, losses;
  zero::comm::CommStats w0, i0, e0;
  DevBytes link0, lo0;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      world->barrier();
      if (reader) link0 = dev_bytes("zc0"), lo0 = dev_bytes("lo");
      w0 = world->stats();
      if (intra) i0 = intra->stats();
      if (inter) e0 = inter->stats();
    }
    Batch batch = train.next_batch(setup.micro_batch, o.context, rank, N, step, 0);
    const auto start = Clock::now();
    at::Tensor loss = model->loss(batch.inputs, batch.targets);
    engine.backward(loss);
    engine.step();
    if (step >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    losses.push_back(loss.item<double>());
  }
  const zero::comm::CommStats w1 = world->stats();
  const zero::comm::CommStats i1 = intra ? intra->stats() : zero::comm::CommStats{};
  const zero::comm::CommStats e1 = inter ? inter->stats() : zero::comm::CommStats{};
  world->barrier();  // every rank's steps are over before the counters are read
  DevBytes link1, lo1;
  if (reader) link1 = dev_bytes("zc0"), lo1 = dev_bytes("lo");

  // After the measurement: the slowest rank per step, the mean loss per
  // step, and each node's counters (zero on the ranks that do not read).
  at::Tensor t = torch::tensor(times, torch::kDouble);
  world->all_reduce(t, zero::comm::ReduceOp::Max);
  at::Tensor l = torch::tensor(losses, torch::kDouble);
  world->all_reduce(l, zero::comm::ReduceOp::Sum);
  l /= N;
  at::Tensor mine = torch::tensor({double(reader), double(world->node(rank)), double(link1.tx - link0.tx),
                                   double(link1.rx - link0.rx), double(lo1.tx - lo0.tx)},
                                  torch::kDouble);
  at::Tensor all = torch::empty({N, 5}, torch::kDouble);
  world->all_gather(all.view({N * 5}), mine);
  const zero::comm::CommStats zero_stats{};
  const json intra_stats = stats_json(i0, intra ? i1 : zero_stats, double(steps));
  const json inter_stats = stats_json(e0, inter ? e1 : zero_stats, double(steps));
  // Each rank's own counts; the max over ranks is reported (they differ by
  // a rank's place in the hierarchy only through rounding).
  at::Tensor counted = torch::tensor({stats_json(w0, w1, double(steps))["total"].get<double>(),
                                      intra_stats["total"].get<double>(), inter_stats["total"].get<double>()},
                                     torch::kDouble);
  world->all_reduce(counted, zero::comm::ReduceOp::Max);

  if (rank == 0) {
    const int nodes = world->nodes();
    const double per_node = double(N) / nodes;
    json node_rows = json::array();
    double link_sent = 0, link_recv = 0, lo_sent = 0;
    for (int r = 0; r < N; ++r) {
      if (all[r][0].item<double>() == 0) continue;
      const double tx = all[r][2].item<double>(), rx = all[r][3].item<double>(), lo = all[r][4].item<double>();
      node_rows.push_back({{"node", int(all[r][1].item<double>())}, {"sent", tx}, {"received", rx}, {"lo", lo}});
      link_sent += tx, link_recv += rx, lo_sent += lo;
    }
    std::vector<double> slowest(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    json j{{"bench", "zeropp"},
           {"variant", flags.str("variant")},
           {"zero_extra", extra},
           {"link_rate", flags.str("link-rate")},
           {"nodes", nodes},
           {"ranks", N},
           {"threads", threads},
           {"blas", blas_kernels()},
           {"params", psi},
           {"depth", o.depth},
           {"width", o.width},
           {"context", o.context},
           {"micro", setup.micro_batch},
           {"dtype", setup.dtype},
           {"reduce_bucket_size", setup.reduce_bucket_size},
           {"warmup", warmup},
           {"steps", steps},
           {"step_s", zero_bench::median(slowest)},
           {"step_times", slowest},
           {"losses", std::vector<double>(l.data_ptr<double>(), l.data_ptr<double>() + l.numel())},
           {"final_loss", l[l.numel() - 1].item<double>()},
           // Per step per rank: the bytes each node sent (received) over its
           // link / the node's ranks, averaged over the nodes.
           {"link_sent_per_rank", link_sent / steps / N},
           {"link_received_per_rank", link_recv / steps / N},
           {"lo_per_rank", lo_sent / steps / N},
           {"ranks_per_node", per_node},
           {"node_counters", node_rows},
           {"counted_world", counted[0].item<double>()},
           {"counted_intra", counted[1].item<double>()},
           {"counted_inter", counted[2].item<double>()},
           {"intra_transport", intra ? intra->host_transport() : std::string("none")},
           {"inter_transport", inter ? inter->host_transport() : std::string("none")},
           {"world_transport", world->host_transport()},
           {"world_stats_rank0", stats_json(w0, w1, double(steps))},
           {"intra_stats_rank0", intra_stats},
           {"inter_stats_rank0", inter_stats}};
    std::ofstream out(flags.str("out"), std::ios::app);
    out << j.dump() << "\n";
    if (!out) throw std::runtime_error("cannot append to " + flags.str("out"));
    std::printf("zeropp %s %s: step %.1f ms, link %.2f MB sent/step/rank, lo %.2f MB, final loss %.5f\n",
                flags.str("variant").c_str(), flags.str("link-rate").c_str(), j["step_s"].get<double>() * 1e3,
                link_sent / steps / N / 1e6, lo_sent / steps / N / 1e6, j["final_loss"].get<double>());
  }
  return 0;
}

double mb(double b) { return b / 1e6; }

int report(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<json> rows;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) rows.push_back(json::parse(line));
  if (rows.empty()) throw std::runtime_error(path + " has no runs");
  const std::vector<std::string> order = {"stage3", "qwZ", "hpZ", "qgZ", "qwZ+hpZ+qgZ"};
  std::vector<std::string> rates;
  for (const auto& r : rows)
    if (std::find(rates.begin(), rates.end(), r["link_rate"].get<std::string>()) == rates.end())
      rates.push_back(r["link_rate"]);
  auto find = [&](const std::string& rate, const std::string& variant) -> const json* {
    for (const auto& r : rows)
      if (r["link_rate"] == rate && r["variant"] == variant) return &r;
    return nullptr;
  };
  const json& any = rows.front();
  std::set<std::string> blas;
  for (const auto& r : rows) blas.insert(r.value("blas", std::string()));
  std::string kernels;
  for (const auto& b : blas) kernels += (kernels.empty() ? "" : ", ") + (b.empty() ? std::string("no OpenBLAS") : b);
  std::printf("## ZeRO++ on %d emulated nodes x %g ranks (tools/netns-cluster.sh), %d thread(s) per rank: GPT %lld params "
              "(depth %lld, width %lld), %s, AdamW, micro batch %lld x context %lld, reduce_bucket_size %lld, "
              "stage3_max_reuse_distance 0 (every unit gathered again for its backward), %lld steps after %lld "
              "warm-up, the same batches in every run\n\n",
              any["nodes"].get<int>(), any["ranks_per_node"].get<double>(), any["threads"].get<int>(),
              (long long)any["params"].get<int64_t>(), (long long)any["depth"].get<int64_t>(),
              (long long)any["width"].get<int64_t>(), any["dtype"].get<std::string>().c_str(),
              (long long)any["micro"].get<int64_t>(), (long long)any["context"].get<int64_t>(),
              (long long)any["reduce_bucket_size"].get<int64_t>(), (long long)any["steps"].get<int64_t>(),
              (long long)any["warmup"].get<int64_t>());
  std::printf("BLAS: %s. Link bytes: frames on each node's link (zc0, headers included) over the measured steps / the "
              "node's ranks, averaged over the nodes (sent; received is the same within a few %%); in-node TCP: the "
              "same on the node's loopback (gloo between ranks of one node). Counted: ring-equivalent bytes of each "
              "rank's collectives (zero::comm::CommStats), max over ranks, on the world group, the dp intra-node "
              "group (shared memory) and the dp inter-node group. Step time: the slowest rank's per step, median. "
              "Goals (issue 40): link bytes <= 0.25x stage 3; step time at 1gbit <= 0.5x stage 3.\n\n",
              kernels.c_str());
  std::printf("| link | variant | link MB/step/rank | x stage 3 | in-node TCP MB | counted world MB | counted intra "
              "MB | counted inter MB | step ms | x stage 3 | final loss | x stage 3 |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  json ratios = json::object();
  for (const auto& rate : rates) {
    const json* base = find(rate, "stage3");
    for (const auto& v : order) {
      const json* r = find(rate, v);
      if (!r) continue;
      const double bytes = (*r)["link_sent_per_rank"], step = (*r)["step_s"], loss = (*r)["final_loss"];
      const double br = base ? bytes / (*base)["link_sent_per_rank"].get<double>() : NAN;
      const double sr = base ? step / (*base)["step_s"].get<double>() : NAN;
      const double lr = base ? loss / (*base)["final_loss"].get<double>() : NAN;
      std::printf("| %s | %s | %.2f | %.3f | %.2f | %.2f | %.2f | %.2f | %.1f | %.3f | %.4f | %.4f |\n", rate.c_str(),
                  v.c_str(), mb(bytes), br, mb((*r)["lo_per_rank"].get<double>()),
                  mb((*r)["counted_world"].get<double>()), mb((*r)["counted_intra"].get<double>()),
                  mb((*r)["counted_inter"].get<double>()), step * 1e3, sr, loss, lr);
      if (v != "stage3")
        ratios[rate][v] = json{{"inter_node_bytes_ratio", std::round(br * 1e4) / 1e4},
                               {"step_time_ratio", std::round(sr * 1e4) / 1e4}};
    }
  }
  std::printf("\nGoals, qwZ+hpZ+qgZ against stage 3:");
  for (const auto& rate : rates) {
    if (!ratios.contains(rate) || !ratios[rate].contains("qwZ+hpZ+qgZ")) continue;
    const double br = ratios[rate]["qwZ+hpZ+qgZ"]["inter_node_bytes_ratio"];
    const double sr = ratios[rate]["qwZ+hpZ+qgZ"]["step_time_ratio"];
    std::printf(" %s: link bytes %.3fx (%s <= 0.25x)", rate.c_str(), br, br <= 0.25 ? "met," : "NOT met,");
    if (rate == "1gbit") std::printf(", step time %.3fx (%s <= 0.5x)", sr, sr <= 0.5 ? "met," : "NOT met,");
    std::printf(";");
  }
  std::printf("\n\n%s\n", ratios.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::string(argv[1]) == "--report") return report(argv[2]);
    const zero_bench::Flags flags(argc, argv,
                                  {{"variant", "stage3"},
                                   {"zero-extra", ""},
                                   {"out", "zeropp.jsonl"},
                                   {"link-rate", "1gbit"},
                                   {"depth", "8"},
                                   {"width", "256"},
                                   {"heads", "8"},
                                   {"context", "64"},
                                   {"micro", "4"},
                                   {"warmup", "3"},
                                   {"steps", "30"},
                                   {"bucket", "500000"},
                                   {"threads", "0"},
                                   {"dtype", "fp32"}});
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_zeropp: %s\n", e.what());
    return 1;
  }
}
