// mesh.c — launching (MPI_Init only under a launcher), aborting every rank on an error, the mesh groups
// as MPI communicators split from MPI_COMM_WORLD (see mesh.h for the rank order), and on the GPU one
// device per rank and an NCCL communicator per group.
#include "parallel/mesh.h"

#include "parallel/nccl_comm.h"

static bool launched;
static int world_size = 1, world_rank = 0, local_rank = 0, local_size = 1;

static void abort_all(int status) { MPI_Abort(MPI_COMM_WORLD, status); }

void dist_launch(void) {
    if (launched ||
        !(getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMI_RANK") || getenv("PMIX_RANK")))
        return;
    int provided;
    MPI_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided));
    launched = true;
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    MPI_CHECK(MPI_Comm_size(node, &local_size));
    MPI_CHECK(MPI_Comm_free(&node));
    // The launcher's own count where it gives one (it is what decides GPU placement elsewhere too).
    const char *env[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        if (getenv(env[i]) && *getenv(env[i])) {
            local_rank = atoi(getenv(env[i]));
            break;
        }
    if (world_size > 1) die_rank = world_rank, die_hook = abort_all;
}

int dist_world_size(void) { return world_size; }
int dist_world_rank(void) { return world_rank; }

void dist_finalize(void) {
    if (!launched) return;
    die_hook = NULL;
    MPI_CHECK(MPI_Finalize());
    launched = false;
}

int dist_rank_of(const Dist *d, int pp, int dp, int cp, int ep) {
    return ((pp * d->dp + dp) * d->cp + cp) * d->ep + ep;
}

// A group: the ranks that share `color` (every coordinate outside the group), ordered by `key` (this
// rank's index inside it). With communicators, split from MPI_COMM_WORLD.
static Comm group(const char *name, int size, int color, int key, bool split, double timeout_s) {
    Comm c = comm_self(name);
    c.size = size, c.rank = key, c.timeout_s = timeout_s;
    if (split && size > 1) {
        MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &c.mpi));
        int n, r;
        MPI_CHECK(MPI_Comm_size(c.mpi, &n));
        MPI_CHECK(MPI_Comm_rank(c.mpi, &r));
        CHECK(n == size && r == key);
    }
    return c;
}

static void mesh_build(Dist *d, int world, int rank, int pp, int cp, int ep, bool hsdp, const char *file, bool split,
                       double timeout_s) {
    memset(d, 0, sizeof *d);
    if (world % (pp * cp * ep))
        die("%s: parallel%s: %d ranks are not divisible by pipeline_parallel_size × context_parallel_size × "
            "expert_parallel_size = %d × %d × %d = %d",
            file, // the key that asks for more than one rank, when one does
            (pp > 1) + (cp > 1) + (ep > 1) != 1 ? ""
            : pp > 1                            ? ".pipeline_parallel_size"
            : cp > 1                            ? ".context_parallel_size"
                                                : ".expert_parallel_size",
            world, pp, cp, ep, pp * cp * ep);
    d->pp = pp, d->cp = cp, d->ep = ep, d->dp = world / (pp * cp * ep), d->hsdp = hsdp;
    int e = rank % ep, c = rank / ep % cp, p = rank / (ep * cp * d->dp), q = rank / (ep * cp) % d->dp, D = d->dp;
    d->world = group("world", world, 0, rank, split, timeout_s);
    if (split && world > 1) d->world.mpi = MPI_COMM_WORLD;
    d->pp_g = group("pp", pp, (q * cp + c) * ep + e, p, split, timeout_s);
    d->dp_g = group("dp", D, (p * cp + c) * ep + e, q, split, timeout_s);
    d->cp_g = group("cp", cp, (p * D + q) * ep + e, c, split, timeout_s);
    d->ep_g = group("ep", ep, (p * D + q) * cp + c, e, split, timeout_s);
    d->dp_cp = group("dp×cp", D * cp, p * ep + e, q * cp + c, split, timeout_s);
    d->dp_cp_ep = group("dp×cp×ep", D * cp * ep, p, (q * cp + c) * ep + e, split, timeout_s);
    d->cp_ep = group("cp×ep", cp * ep, p * D + q, c * ep + e, split, timeout_s);
    d->dp_ep = group("dp×ep", D * ep, p * cp + c, q * ep + e, split, timeout_s);
}

void dist_mesh_init(Dist *d, int pp, int cp, int ep, bool hsdp, double timeout_s, const char *file) {
    dist_launch();
    mesh_build(d, world_size, world_rank, pp, cp, ep, hsdp, file, launched, timeout_s);
}

void dist_mesh_describe(Dist *d, int world, int rank, int pp, int cp, int ep, bool hsdp, const char *file) {
    mesh_build(d, world, rank, pp, cp, ep, hsdp, file, false, 0);
}

// Every group of d, world first.
#define ALL_GROUPS(d)                                                                                                  \
    { &d->world, &d->pp_g, &d->dp_g, &d->cp_g, &d->ep_g, &d->dp_cp, &d->dp_cp_ep, &d->cp_ep, &d->dp_ep }

void dist_mesh_gpu(Dist *d) {
    if (d->world.size == 1) return;
#ifdef PITH_NCCL
    nccl_bind_device(local_rank, local_size);
    // Groups with the same ranks in the same order share one communicator (at ep = world size, world, ep,
    // dp×cp×ep, cp×ep and dp×ep are one set). Every rank makes the same choices in the same order: the
    // groups of one kind partition the world alike, so NCCL's collective set-ups pair up.
    Comm *all[] = ALL_GROUPS(d);
    int n = (int)(sizeof all / sizeof *all);
    for (int i = 0; i < n; i++) {
        if (all[i]->size == 1) continue;
        for (int j = 0; j < i && !all[i]->nccl; j++) {
            int same = MPI_UNEQUAL;
            if (all[j]->nccl) MPI_CHECK(MPI_Comm_compare(all[i]->mpi, all[j]->mpi, &same));
            if (same == MPI_IDENT || same == MPI_CONGRUENT) all[i]->nccl = all[j]->nccl, all[i]->dev = DEV_CUDA;
        }
        if (!all[i]->nccl) nccl_comm_create(all[i]);
    }
#else
    die("multi-rank training on the GPU needs NCCL, which this build does not have (a CUDA build that finds nccl.h); "
        "use device \"cpu\"");
#endif
}

void dist_mesh_free(Dist *d) {
    Comm *all[] = ALL_GROUPS(d);
    int n = (int)(sizeof all / sizeof *all);
#ifdef PITH_NCCL
    bool gpu = false;
    for (int i = 0; i < n; i++) gpu |= all[i]->nccl != NULL;
    if (gpu) nccl_shutdown(); // the watchdog first: it reads the communicators
    for (int i = 0; i < n; i++) nccl_comm_destroy(all[i]);
#endif
    for (int i = 1; i < n; i++) // world's is MPI_COMM_WORLD
        if (all[i]->mpi != MPI_COMM_NULL && launched) MPI_CHECK(MPI_Comm_free(&all[i]->mpi));
    memset(d, 0, sizeof *d);
}
