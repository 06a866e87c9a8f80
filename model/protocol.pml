/*
 * pubsub-worker's exactly-once processing protocol, for SPIN.
 *
 * One job (one key); its original message and the copy `jobs replay`
 * publishes; two worker processes, the first with two callback threads (so a
 * message can be delivered to it again while its first delivery runs); the
 * job document; Pub/Sub with exactly-once delivery; the operator's `jobs show`, `jobs release
 * --expect-epoch`, `jobs replay`, and a foreign write that moves the version and changes no
 * owner (an edit by hand in the Firestore console, an admin script).
 * docs/protocol.md maps every action to the function that implements it,
 * says what is abstracted and why, and states each property.
 * `python model/check.py` checks them, and that every branch of the model is
 * taken in some run; with --mutants it also refutes the named mutants below.
 *
 * Mutants (spin -DMUTANT_X):
 *   MUTANT_COMMIT_UNCONDITIONED      the owner's writes land without the version condition
 *   MUTANT_ACK_BEFORE_DURABLE        the ack is sent before the completion is written
 *   MUTANT_CLAIM_NO_EPOCH_BUMP       a claim keeps the epoch it read
 *   MUTANT_RENEW_UNCONDITIONED       the lease renewal writes without its checks and without
 *                                    the version condition
 *   MUTANT_COMPLETE_WITH_UNSENT      the completion does not publish unsent entries first
 *   MUTANT_REVIEW_BEFORE_RECORD      the failure message is published before the failed record
 *                                    is written (the order of releases up to 0.9)
 *   MUTANT_TAKE_OVER_LIVE            a newer delivery of a message running in its process takes
 *                                    the job over at once, its live lease included (the rule
 *                                    before adoption: ours_superseded)
 *   MUTANT_SETTLE_WITHOUT_EPOCH      a refused write, read again, is sent again without the
 *                                    epoch compared (equivalent: the delivery implies it)
 *   MUTANT_OWNER_MARK_UNCONDITIONED  the owner's `review: sent` mark without its version condition
 *   MUTANT_PENDING_MARK_UNCONDITIONED  the pending publisher's mark without its version condition
 *
 * Safety properties are assertions, each enabled by -DCHECK_<NAME> (or all
 * by -DCHECK_ALL); the liveness property is the ltl formula at the end.
 * Lines starting with "@" in a replayed trail are this model's narration;
 * `nothing` marks a branch that does nothing, so that the driver can tell it is taken.
 */

/* ---------------------------------------------------------------- sizes */

#define NT      3               /* callback threads: t0 and t2 in process 0, t1 in process 1 */
#define NMSG    2               /* message 0: the original; 1: the copy a replay publishes */
#define MAXATT  2               /* MAX_ATTEMPTS */
#define SATATT  (MAXATT + 2)    /* attempts saturate here: every value above MAXATT decides alike */
#ifndef MAXF
#define MAXF    2               /* faults in one run, at most */
#endif

#define NOBODY  255             /* no thread, process or message */
#define OLD     254             /* a writer whose version no one holds: one whose delivery ended,
                                   the operator, a mark of the review */

#define PROC(t)     ((t) % 2)           /* the process of thread t */
#define HASMATE(t)  ((t) != 1)          /* t0 and t2 share process 0 */
#define MATE(t)     (2 - (t))           /* the other thread of process 0 (only if HASMATE) */

/* the job's status */
#define ABSENT    0
#define RUNNING   1
#define RELEASED  2
#define COMPLETED 3
#define FAILED    4

/* steps, as bits of a mask; SENT is the outbox entry's sent mark, staged */
#define S0   1                  /* a step without outbox entries: its record is lazy */
#define S1   2                  /* a step that publishes one outbox entry: committed at once */
#define SENT 4

/* what a write concludes, besides its staged records */
#define GOES_ON   0             /* nothing: a renewal, a record */
#define DONE      1             /* the completion */
#define RETRY     2             /* a release, the attempt counted */
#define GIVEN     3             /* a release, the attempt given back */
#define FAIL      4             /* the failed record, `review: pending` */

/* ----------------------------------------------------------- properties */

#ifdef CHECK_ALL
#define CHECK_ONE_COMPLETION 1
#define CHECK_FENCED 1
#define CHECK_STEPS 1
#define CHECK_ONE_RUN_PER_PROCESS 1
#define CHECK_ACK_AFTER_DURABLE 1
#define CHECK_OUTBOX 1
#define CHECK_FAILED_XOR_COMPLETED 1
#define CHECK_RELEASE_AIMED 1
#define CHECK_REVIEW_ONLY_FAILED 1
#endif
#ifndef CHECK_ONE_COMPLETION
#define CHECK_ONE_COMPLETION 0
#endif
#ifndef CHECK_FENCED
#define CHECK_FENCED 0
#endif
#ifndef CHECK_STEPS
#define CHECK_STEPS 0
#endif
#ifndef CHECK_ONE_RUN_PER_PROCESS
#define CHECK_ONE_RUN_PER_PROCESS 0
#endif
#ifndef CHECK_ACK_AFTER_DURABLE
#define CHECK_ACK_AFTER_DURABLE 0
#endif
#ifndef CHECK_OUTBOX
#define CHECK_OUTBOX 0
#endif
#ifndef CHECK_FAILED_XOR_COMPLETED
#define CHECK_FAILED_XOR_COMPLETED 0
#endif
#ifndef CHECK_RELEASE_AIMED
#define CHECK_RELEASE_AIMED 0
#endif
#ifndef CHECK_REVIEW_ONLY_FAILED
#define CHECK_REVIEW_ONLY_FAILED 0
#endif

#define one_completion(c)        assert(!CHECK_ONE_COMPLETION || (c))
#define fenced(c)                assert(!CHECK_FENCED || (c))
#define steps(c)                 assert(!CHECK_STEPS || (c))
#define one_run_per_process(c)   assert(!CHECK_ONE_RUN_PER_PROCESS || (c))
#define ack_after_durable(c)     assert(!CHECK_ACK_AFTER_DURABLE || (c))
#define outbox(c)                assert(!CHECK_OUTBOX || (c))
#define failed_xor_completed(c)  assert(!CHECK_FAILED_XOR_COMPLETED || (c))
#define release_aimed(c)         assert(!CHECK_RELEASE_AIMED || (c))
#define review_only_failed(c)    assert(!CHECK_REVIEW_ONLY_FAILED || (c))

/* A branch that does nothing but must be seen taken (the driver counts each statement). */
#define nothing printf("~\n")

/* ------------------------------------------------- the job document */

byte st = ABSENT;               /* status */
byte dthr = NOBODY;             /* `delivery` of the running claim: the thread holding it; NOBODY: none */
bit  live;                      /* the lease: update_time + lease_seconds > the reader's read time */
byte rec;                       /* steps recorded (S0, S1) */
bit  obc;                       /* S1's outbox entry is committed ... */
bit  obs;                       /* ... and marked sent */
byte datt;                      /* attempts, saturated at SATATT */
bit  rvp;                       /* `review: pending`: failed, its failure message not published */
byte lastw = NOBODY;            /* the version: who wrote last (thread t's condition holds iff lastw == t) */

/* ------------------------------------------------------------ Pub/Sub */

bit  published[NMSG];
bit  acked[NMSG];
byte valid[NMSG] = NOBODY;      /* the thread holding the latest, unexpired ack id; NOBODY: to deliver */

/* ------------------------------------------------ each process's tracker */

byte latest[2 * NMSG] = NOBODY; /* latest[p * NMSG + m]: the thread of p's newest delivery of m */

/* ------------------------------------------------------------ each thread */

byte tm[NT] = NOBODY;           /* the message of its delivery; NOBODY: idle */
bit  epc[NT];                   /* its epoch is the document's */
byte stg[NT];                   /* staged for its next write: S0, S1, SENT */
byte known[NT];                 /* steps it knows recorded (its claim's read, and its own) */
bit  unsent[NT];                /* S1's entry is in its outbox, not published by it yet */
byte att[NT];                   /* its attempt: the attempts its claim wrote (0: no claim yet) */
bit  stop[NT];                  /* stop_error: LostOwnership */
bit  lost[NT];                  /* its delivery is known lost (a renewal refused, a stall given up) */
bit  rera[NT];                  /* the era (replays so far) in which it saw the job failed */
bit  wt[NT];                    /* it adopted its mate's delivery of its message: waits for it */
bit  capped[NT];                /* it ran past MAX_PROCESSING_SECONDS: abandoned, not renewed */
bit  vread[NT];                 /* the version it read (a failed job, review pending) is the document's */

/* ---------------------------------------------- faults, operator, ghosts */

byte nf;                        /* faults so far */
byte phase;                     /* the operator's: 0 nothing yet; 1 shown; 2 released (or refused) */
bit  op_epc;                    /* the epoch `jobs show` showed is still the document's */
bit  op_claimed;                /* ghost: a claim landed since that `jobs show` (while shown) */
bit  fw;                        /* a foreign write changed the job, not its owner */
byte ncomplete;                 /* ghost: completions landed */
bit  pubs;                      /* ghost: S1's entry was published (at least once) */
bit  final_since[NMSG];         /* ghost: completed or failed since message m was published */
bit  reviewed;                  /* ghost: a failure message of this era went out (reset by a replay) */

/* scratch, used inside atomic sequences only: not part of the state (pan's breadth-first
 * search, used for short counterexamples, cannot have hidden variables) */
#ifdef BFS_TRAILS
#define SCRATCH
#else
#define SCRATCH hidden
#endif
SCRATCH byte k;                 /* a loop index */
SCRATCH byte ok;                /* a write's answer */
SCRATCH byte fin;               /* what the write concludes (GOES_ON, DONE, ...) */

/* ---------------------------------------------------------- predicates */

#define FAULT       (nf < MAXF)
#define FINAL       (st == COMPLETED || st == FAILED)
#define RECV(m)     (published[m] && !acked[m] && valid[m] == NOBODY)
#define NEWEST(t)   (latest[PROC(t) * NMSG + tm[t]] == (t))          /* the newest delivery here */
#define ADOPTED(t)  (HASMATE(t) && wt[MATE(t)])                     /* a newer one waits for it */
#ifdef MUTANT_TAKE_OVER_LIVE
#define CUR(t)      (!lost[t] && NEWEST(t))                         /* tracker.is_current */
/* claim.decide's ours_superseded: the lease is held by an older delivery of this message here */
#define SUPERSEDED(t) (dthr != NOBODY && dthr != (t) && PROC(dthr) == PROC(t) && tm[dthr] == tm[t])
#define BUSY(t)     (st == RUNNING && live && !SUPERSEDED(t))
#else
#define CUR(t)      (!lost[t] && (NEWEST(t) || ADOPTED(t)))         /* tracker.is_current */
#define BUSY(t)     (st == RUNNING && live)                         /* ClaimKind.BUSY */
#endif
#define CHECK(t)    (!stop[t] && CUR(t))                            /* JobOwnership._check_owner */
#define OURS(t)     (epc[t] && dthr == (t) && st == RUNNING)        /* FencedDocument.read_own */
#ifdef MUTANT_SETTLE_WITHOUT_EPOCH
#define STILL_OURS(t) (dthr == (t) && st == RUNNING)
#else
#define STILL_OURS(t) OURS(t)
#endif
/* another delivery of the job in t's process has claimed it and not ended, nor passed its cap */
#define MATE_RUNS(t) (HASMATE(t) && att[MATE(t)] > 0 && !capped[MATE(t)])

/* ------------------------------------------------------------- writes */

/* The version moved: a version read earlier is stale. */
inline moved() {
    vread[0] = 0;
    vread[1] = 0;
    vread[2] = 0
}

/* The epoch grows: every holder of the old one is stale. */
inline bump_epoch() {
    k = 0;
    do
    :: k < NT -> epc[k] = 0; k++
    :: else -> k = 0; break
    od;
    op_epc = 0
}

/* The claim's identity no longer decides anything (not running, or its lease lapsed). */
inline unclaimed() {
    dthr = NOBODY
}

/* A write of thread t lands: its staged records ride along, and it renews the lease of
 * the claim's holder (with no live holder, that lease runs out at once, as when one ends);
 * `fin` says what else it writes. */
inline land(t) {
    fenced(OURS(t));
    lastw = t;
    moved();
    if
    :: stg[t] & S0 -> steps(!(rec & S0)); rec = rec | S0
    :: else -> nothing
    fi;
    if
    :: stg[t] & S1 -> steps(!(rec & S1)); rec = rec | S1; obc = 1
    :: else -> nothing
    fi;
    if
    :: stg[t] & SENT -> outbox(pubs); obs = 1
    :: else -> nothing
    fi;
    stg[t] = 0;
    if
    :: fin == GOES_ON -> live = (dthr != NOBODY)
    :: fin == DONE ->
        one_completion(ncomplete == 0);
        review_only_failed(!reviewed);
        failed_xor_completed(st == RUNNING);
        outbox(!obc || obs);
        st = COMPLETED;
        ncomplete++;
        final_since[0] = 1;
        final_since[1] = 1;
        live = 0;
        unclaimed()
    :: fin == RETRY -> st = RELEASED; datt = att[t]; live = 0; unclaimed()
    :: fin == GIVEN -> st = RELEASED; datt = att[t] - 1; live = 0; unclaimed()
    :: fin == FAIL ->
        failed_xor_completed(st == RUNNING);
        st = FAILED;
        rvp = 1;
        final_since[0] = 1;
        final_since[1] = 1;
        live = 0;
        unclaimed()
    fi
}

/* FencedDocument.write: conditioned on our version; a conflict is settled by reading
 * (still ours: the write is sent again on the version read; else LostOwnership). A write
 * may land with its answer lost: the store reads its write back, and finds the job
 * written since (by whoever moved it on), which FencedDocument settles by reading. */
inline fwrite(t) {
#ifdef MUTANT_COMMIT_UNCONDITIONED
    ok = 1;
#else
    if
    :: lastw == t -> ok = 1                                         /* our version */
    :: lastw != t && STILL_OURS(t) -> ok = 1;
        printf("@ t%d: its write is refused (written since); read again, the job is its own: sent again\n", t)
    :: lastw != t && !STILL_OURS(t) -> ok = 0; stop[t] = 1;        /* LostOwnership */
        printf("@ t%d: its write is refused: the job is not its own any more\n", t)
    :: FAULT && lastw == t -> nf++; land(t); ok = 0; stop[t] = 1;
        printf("@ t%d: its write lands, its answer is lost; read back, the job was moved on: LostOwnership\n", t)
    fi;
#endif
    if
    :: ok -> land(t)
    :: else -> nothing
    fi;
    fin = GOES_ON
}

/* JobOwnership.keep_alive (or record_step's write once a third of the lease passed): not
 * once the delivery is stopped, not current, or past its cap (the keeper abandoned it). */
inline renew(t) {
#ifdef MUTANT_RENEW_UNCONDITIONED
    printf("@ t%d: renews the lease (unconditionally)\n", t);
    land(t)
#else
    if
    :: CHECK(t) && !capped[t] -> printf("@ t%d: renews the lease\n", t); fwrite(t); ok = 0
    :: else -> printf("@ t%d: renews nothing (stopped, not current, or past its cap)\n", t)
    fi
#endif
}

/* Outbox.send of S1's entry: published; not published; or published with its answer lost. */
inline publish(t) {
    outbox(obc);
    if
    :: pubs = 1; unsent[t] = 0; stg[t] = stg[t] | SENT;
        printf("@ t%d: publishes the outbox entry (its sent mark staged)\n", t)
    :: FAULT -> nf++; printf("@ t%d: the outbox entry's publish fails\n", t)
    :: FAULT -> nf++; pubs = 1; printf("@ t%d: publishes the outbox entry; the answer is lost\n", t)
    fi
}

/* A delivery that can no longer ack learns it at a boundary (the keeper's modack was
 * refused, or it gave the stalled delivery up), or not yet. */
inline learn(t) {
    if
    :: valid[tm[t]] != t && !lost[t] -> lost[t] = 1; printf("@ t%d: learns its delivery is lost\n", t)
    :: true
    fi
}

/* claim.claim: create, or compare-and-set on the version just read (one atomic step). */
inline claim(t) {
    if
    :: st == ABSENT -> datt = 1
    :: st != ABSENT && datt < SATATT -> datt++
    :: else -> nothing
    fi;
    st = RUNNING;
    dthr = t;
    live = 1;
    lastw = t;
    moved();
#ifndef MUTANT_CLAIM_NO_EPOCH_BUMP
    bump_epoch();
#endif
    if
    :: phase == 1 -> op_claimed = 1
    :: else -> nothing
    fi;
    epc[t] = 1;
    att[t] = datt;
    known[t] = rec;
    unsent[t] = obc && !obs;
    printf("@ t%d: claims the job (attempt %d)\n", t, datt)
}

/* The thread's state between deliveries. */
inline forget(t) {
    if
    :: lastw == t -> lastw = OLD
    :: else -> nothing
    fi;
    epc[t] = 0;
    stg[t] = 0;
    known[t] = 0;
    unsent[t] = 0;
    att[t] = 0;
    stop[t] = 0;
    lost[t] = 0;
    rera[t] = 0;
    wt[t] = 0;
    capped[t] = 0;
    vread[t] = 0;
    tm[t] = NOBODY
}

/* A delivery ends: whoever waited for it settles now; a claim it held is not renewed by
 * anyone, so its lease runs out. */
inline ended(t) {
    if
    :: HASMATE(t) && wt[MATE(t)] -> wt[MATE(t)] = 0
    :: else -> nothing
    fi;
    if
    :: dthr == t -> live = 0; unclaimed()
    :: else -> nothing
    fi;
    forget(t)
}

/* Thread t's process crashes (while t is its only busy thread): its delivery ends with no
 * memory (its ack id lapses, its tracker is empty, a claim it held is left to lapse). */
inline crash(t) {
    if
    :: valid[tm[t]] == t -> valid[tm[t]] = NOBODY
    :: else -> nothing
    fi;
    latest[PROC(t) * NMSG] = NOBODY;
    latest[PROC(t) * NMSG + 1] = NOBODY
}

/* A failure message goes out (FailurePath): it describes a failure of the job's current era
 * only while the job is failed; one of an earlier era (a late duplicate, after a replay
 * revived the job) describes the failure the operator replayed. */
inline review_out(t) {
    review_only_failed(st == FAILED || rera[t] != published[1]);
    if
    :: rera[t] == published[1] -> reviewed = 1
    :: else -> nothing
    fi
}

/* FailurePath._mark_sent: `review: sent`, conditioned on the version the marker holds
 * (`held`: the failed record's, for its owner; the one read, for a delivery that found the
 * review pending). Refused, it reads the job again and marks it on the version read if it
 * still holds this failure (failed in the same era, review pending): a writer that moved the
 * version and left the failure as it was (a foreign write) does not leave it pending for good. */
inline mark(t, held) {
    if
    :: (held) -> rvp = 0; lastw = OLD; moved(); printf("@ t%d: marks the review sent\n", t)
    :: !(held) && st == FAILED && rera[t] == published[1] && rvp ->
        rvp = 0; lastw = OLD; moved();
        printf("@ t%d: its mark is refused (written since); read again, still this failure: marked\n", t)
    :: !(held) && !(st == FAILED && rera[t] == published[1] && rvp) ->
        printf("@ t%d: its mark is refused (marked since, or replayed)\n", t)
    fi
}

/* The mutants' mark: written on whatever version the job is at. */
inline unconditioned_mark(t) {
    rvp = 0;
    lastw = OLD;
    moved();
    printf("@ t%d: marks the review sent (unconditioned)\n", t)
}

/* The faults that may strike a busy thread before its next step, within the budget:
 * it was slow and its ack deadline lapsed; its process crashed (not while t0 and t2 are both
 * busy: that crash could strike only while t2 waits, within the budget, and it reaches only
 * states that the crash before the redelivery reaches with a fault to spare). */
#define SLOW(t) \
    :: atomic { FAULT && valid[tm[t]] == t -> nf++; valid[tm[t]] = NOBODY; \
        printf("@ t%d: is slow: its ack deadline lapses\n", t) } \
    :: atomic { FAULT && (!HASMATE(t) || tm[MATE(t)] == NOBODY) -> nf++; \
        printf("@ t%d: its process crashes\n", t); crash(t); goto done }

/* ... and, once it may hold the claim: it was slow and the claim's lease lapsed. */
#define SLOWH(t) \
    SLOW(t) \
    :: atomic { FAULT && dthr == t && live -> nf++; live = 0; \
        printf("@ t%d: is slow: its lease lapses\n", t) }

/* ... and, right after its claim: it was slow and Pub/Sub hands the message again to its
 * process, to t2, while it runs. (Only here: t2 waits and does nothing that depends on when
 * it came, so a later redelivery reaches no other state; an earlier one, before the claim,
 * neither: t0's claim does not look at t2.) */
#define SLOWA(t) \
    SLOWH(t) \
    :: atomic { FAULT && valid[tm[t]] == t && t == 0 && tm[2] == NOBODY -> nf++; redeliver(); \
        printf("@ t0: is slow: its ack deadline lapses; t2 receives message %d\n", tm[0]) }

/* ... and, in its handler: it runs past its processing cap while a newer delivery here waits
 * for it (abandoned: not renewed; its next boundary raises ProcessingTimeout). */
#define SLOWC(t) \
    SLOWH(t) \
    :: atomic { FAULT && ADOPTED(t) && !capped[t] -> nf++; capped[t] = 1; \
        if \
        :: dthr == t -> live = 0 \
        :: else -> nothing \
        fi; \
        printf("@ t%d: is slow: it passes its processing cap\n", t) }

/* A boundary of the handler (JobOwnership._check): a delivery not current or stopped stops
 * (LostOwnership); one past its cap stops with ProcessingTimeout, a failed attempt. */
#define BOUNDARY(t) \
    learn(t); \
    if \
    :: !CHECK(t) -> stop[t] = 1; goto giveback \
    :: CHECK(t) && capped[t] -> printf("@ t%d: stops: ProcessingTimeout\n", t); goto handler_error \
    :: CHECK(t) && !capped[t] -> nothing \
    fi

/* ---------------------------------------------------- a callback thread */

/* Thread t0 or t1 may receive message m when idle (t0: while t2 is idle too). */
#define MAY_RECV(t, m) (RECV(m) && ((t) == 1 || ((t) == 0 && tm[2] == NOBODY)))

/* Pub/Sub hands t0's message again to its process while t0 runs it (its ack deadline lapsed),
 * to t2, which adopts t0's delivery (SLOWA says when). Another message of the key would wait
 * in the key gate, which the model leaves out. */
inline redeliver() {
    tm[2] = tm[0];
    valid[tm[0]] = 2;
    latest[PROC(0) * NMSG + tm[0]] = 2;
#ifndef MUTANT_TAKE_OVER_LIVE
    wt[2] = 1
#else
    skip
#endif
}

proctype Thread(byte t) {
end_idle:
    do
    :: if
       :: atomic {
            t != 2 && (MAY_RECV(t, 0) || MAY_RECV(t, 1)) ->
            if
            :: MAY_RECV(t, 0) -> tm[t] = 0
            :: MAY_RECV(t, 1) -> tm[t] = 1
            fi;
            valid[tm[t]] = t;
            latest[PROC(t) * NMSG + tm[t]] = t;
            printf("@ t%d: receives message %d\n", t, tm[t])
          }
       :: t == 2 && tm[t] != NOBODY                                     /* redeliver() */
       fi;
       if
       :: wt[t] -> goto adopting
       :: else -> nothing
       fi;

claiming:
       /* the claim (claiming.claim_job, claim.claim): another owner's live lease is
        * waited for (polled, then deferred until it runs out), unless the delivery lapsed */
       do
       SLOW(t)
       :: atomic {
            (!BUSY(t) || valid[tm[t]] != t || lost[t]) ->
            learn(t);
            if
            :: !CUR(t) -> goto giveback                                 /* DROP */
            :: else -> nothing
            fi;
            if
            :: st == FAILED && rvp ->                                   /* publish_pending */
                printf("@ t%d: finds the job failed, its failure message pending\n", t);
                rera[t] = published[1];
                vread[t] = 1;
                goto pending
            :: FINAL && !(st == FAILED && rvp) ->
                printf("@ t%d: finds the job done\n", t); goto ack              /* ACK */
            :: BUSY(t) -> printf("@ t%d: finds the job busy\n", t); goto giveback  /* DEFER */
            :: !FINAL && !BUSY(t) -> claim(t); break
            fi
          }
       od;

       /* earlier owners' unsent entries go out first; then: attempts left? (flow._start)
        * (no step may start with an `if` holding an `else`: SPIN would make that `else`
        * compete with the faults of SLOW, taking it only when no fault can strike) */
       do
       SLOWA(t)
       :: atomic {
            skip;
            if
            :: unsent[t] ->
                learn(t);
                if
                :: !CHECK(t) -> stop[t] = 1; goto giveback              /* NACK or DROP */
                :: else -> publish(t)
                fi;
                if
                :: unsent[t] -> goto release_nocount                    /* OutboxUnsent: RELEASE */
                :: else -> nothing
                fi
            :: else -> nothing
            fi;
            if
            :: att[t] > MAXATT -> goto review                           /* REVIEW */
            :: else -> break
            fi
          }
       od;
       /* the claim is progress: the lease is renewed with the Pub/Sub one (or not yet) */
       if
       :: do
          SLOWC(t)
          :: atomic { renew(t); break }
          od
       :: skip
       fi;

       /* step S0 (JobCore.run_step): the function runs, its record is staged */
       do
       SLOWC(t)
       :: atomic {
            BOUNDARY(t);
            if
            :: known[t] & S0 -> printf("@ t%d: skips S0 (recorded)\n", t)
            :: else ->
                steps(!(OURS(t) && (rec & S0)));
                one_run_per_process(capped[t] || !MATE_RUNS(t));
                stg[t] = stg[t] | S0;
                known[t] = known[t] | S0;
                printf("@ t%d: runs S0; its record is staged\n", t)
            fi;
            break
          }
       od;
       /* a staged record is progress: renewed (its record rides along), or not yet */
       if
       :: stg[t] & S0 ->
          do
          SLOWC(t)
          :: atomic { renew(t); break }
          od
       :: skip
       fi;

       /* step S1: the previous step's record is durable before it runs (open_step) */
       do
       SLOWC(t)
       :: atomic {
            BOUNDARY(t);
            if
            :: known[t] & S1 -> printf("@ t%d: skips S1 (recorded)\n", t); goto returned
            :: else -> nothing
            fi;
            if
            :: stg[t] & S0 ->
                printf("@ t%d: writes S0's record\n", t);
                fwrite(t);
                if
                :: !ok -> goto giveback
                :: else -> ok = 0
                fi
            :: else -> nothing
            fi;
            break
          }
       od;

       /* S1's function runs (or raises); its record and outbox entry are written at once */
       do
       SLOWC(t)
       :: atomic {
            steps(rec & S0);
            steps(!(OURS(t) && (rec & S1)));
            one_run_per_process(capped[t] || !MATE_RUNS(t));
            if
            :: true
            :: printf("@ t%d: S1 raises\n", t); goto handler_error
            :: printf("@ t%d: S1 raises PermanentError\n", t); goto handler_permanent
            fi;
            printf("@ t%d: runs S1; writes its record and outbox entry\n", t);
            stg[t] = stg[t] | S1;
            fwrite(t);
            if
            :: ok ->
                ok = 0;
                known[t] = known[t] | S1;
                unsent[t] = 1
            :: else -> goto giveback
            fi;
            break
          }
       od;

       /* after the commit, the entry is published if it can be (_try_publish_unsent) */
       do
       SLOWC(t)
       :: atomic {
            BOUNDARY(t);
            publish(t);
            break
          }
       od;

returned:
       /* the handler returns: COMPLETE (JobCore.complete); or it raises after its steps */
       do
       SLOWC(t)
       :: atomic {
            learn(t);
            if
            :: true
            :: printf("@ t%d: the handler raises after its steps\n", t); goto handler_error
            fi;
            if
            :: !CHECK(t) -> stop[t] = 1; goto giveback                  /* the stop decides */
            :: CHECK(t) && capped[t] -> printf("@ t%d: stops: ProcessingTimeout\n", t);
                goto handler_error
            :: CHECK(t) && !capped[t] -> nothing
            fi;
#ifndef MUTANT_COMPLETE_WITH_UNSENT
            if
            :: unsent[t] ->
                publish(t);
                if
                :: unsent[t] -> goto release_nocount                    /* OutboxUnsent: RELEASE */
                :: else -> nothing
                fi
            :: else -> nothing
            fi;
#endif
            break
          }
       od;
#ifdef MUTANT_ACK_BEFORE_DURABLE
       do
       SLOWC(t)
       :: atomic {
            printf("@ t%d: acks (before the completion is written)\n", t);
            ack_after_durable(final_since[tm[t]]);
            if
            :: valid[tm[t]] == t -> acked[tm[t]] = 1; valid[tm[t]] = NOBODY
            :: else
            fi;
            break
          }
       od;
#endif
       do
       SLOWC(t)
       :: atomic {
            printf("@ t%d: writes the completion\n", t);
            fin = DONE;
            fwrite(t);
            if
            :: ok -> ok = 0
            :: else -> goto giveback
            fi;
#ifdef MUTANT_ACK_BEFORE_DURABLE
            goto done
#else
            goto ack
#endif
          }
       od;

handler_error:
       /* a failed attempt: RETRY, or REVIEW at MAX_ATTEMPTS; stopped or stale: no write */
       do
       SLOWC(t)
       :: atomic {
            learn(t);
            if
            :: stop[t] || !CUR(t) -> goto giveback
            :: else -> nothing
            fi;
            if
            :: att[t] >= MAXATT -> goto review
            :: else ->
                printf("@ t%d: releases the job (the attempt counted)\n", t);
                fin = RETRY;
                fwrite(t);
                ok = 0;
                goto giveback
            fi
          }
       od;

handler_permanent:
       /* PermanentError: REVIEW at once; stopped or stale: no write */
       do
       SLOWC(t)
       :: atomic {
            learn(t);
            if
            :: stop[t] || !CUR(t) -> goto giveback
            :: else -> goto review
            fi
          }
       od;

release_nocount:
       /* RELEASE: an entry could not be published; the attempt is given back */
       do
       SLOWH(t)
       :: atomic {
            printf("@ t%d: releases the job (the attempt given back)\n", t);
            fin = GIVEN;
            fwrite(t);
            ok = 0;
            goto giveback
          }
       od;

review:
       /* the failure path (FailurePath.send): a fenced write first, a stale owner stops here */
       do
       SLOWH(t)
       :: atomic {
            printf("@ t%d: sends the job to the failure path: a fenced write\n", t);
            fwrite(t);
            if
            :: ok -> ok = 0; break
            :: else -> goto giveback
            fi
          }
       od;
       /* unsent entries go out (one that cannot stays unsent, for a replay), their marks
        * written before the review goes out */
       if
       :: unsent[t] ->
           do
           SLOWH(t)
           :: atomic {
                learn(t);
                if
                :: !CHECK(t) -> stop[t] = 1; goto giveback
                :: else -> publish(t); break
                fi
              }
           od;
           if
           :: stg[t] & SENT ->
               do
               SLOWH(t)
               :: atomic {
                    printf("@ t%d: writes the sent mark\n", t);
                    fwrite(t);
                    if
                    :: ok -> ok = 0; break
                    :: else -> goto giveback
                    fi
                  }
               od
           :: else -> nothing
           fi
       :: else -> nothing
       fi;
#ifdef MUTANT_REVIEW_BEFORE_RECORD
       do
       SLOWH(t)
       :: atomic { FAULT -> nf++; printf("@ t%d: the failure message's publish fails\n", t);
                   goto giveback }
       :: atomic { printf("@ t%d: publishes the failure message\n", t);
                   rera[t] = published[1]; review_out(t); break }
       od;
#endif
       /* the failed record, fenced; `review: pending` */
       do
       SLOWH(t)
       :: atomic {
            printf("@ t%d: writes the failed record (review pending)\n", t);
            fin = FAIL;
            fwrite(t);
            if
            :: ok -> ok = 0; rera[t] = published[1]; break
            :: else -> goto giveback
            fi
          }
       od;
#ifdef MUTANT_REVIEW_BEFORE_RECORD
       rvp = 0;
       goto ack;
#endif
       /* the failure message: published, or its publish fails (DEFER: the redelivery publishes) */
       do
       SLOW(t)
       :: atomic { FAULT -> nf++; printf("@ t%d: the failure message's publish fails\n", t);
                   goto giveback }
       :: atomic { printf("@ t%d: publishes the failure message\n", t); review_out(t); break }
       od;
       /* `review: sent`, conditioned on the failed record's version */
       do
       SLOW(t)
       :: atomic {
#ifdef MUTANT_OWNER_MARK_UNCONDITIONED
            unconditioned_mark(t);
#else
            mark(t, lastw == t);
#endif
            goto ack
          }
       od;

adopting:
       /* a newer delivery of a message running here (the flow's adoption): no claim, no run;
        * it waits for the running delivery to end and settles from the record; only when that
        * one is past its cap does it claim, as another process would */
       do
       SLOW(t)
       :: atomic {
            !wt[t] ->
            learn(t);
            if
            :: !CUR(t) -> goto giveback                                 /* DROP */
            :: else -> nothing
            fi;
            if
            :: st == FAILED && rvp ->
                printf("@ t%d: finds the job failed, its failure message pending\n", t);
                rera[t] = published[1];
                vread[t] = 1;
                goto pending
            :: FINAL && !(st == FAILED && rvp) ->
                printf("@ t%d: finds the job done\n", t); goto ack
            :: !FINAL -> printf("@ t%d: finds the job not done\n", t); goto giveback
            fi
          }
       :: atomic {
            wt[t] && capped[MATE(t)] -> wt[t] = 0;
            printf("@ t%d: the delivery it waits for is past its cap: it claims\n", t);
            goto claiming
          }
       od;

pending:
       /* a failed job's pending failure message, published before the ack (publish_pending) */
       do
       SLOW(t)
       :: atomic { FAULT -> nf++; printf("@ t%d: the failure message's publish fails\n", t);
                   goto giveback }
       :: atomic { printf("@ t%d: publishes the pending failure message\n", t); review_out(t);
                   break }
       od;
       do
       SLOW(t)
       :: atomic {
            /* conditioned on the version it read */
#ifdef MUTANT_PENDING_MARK_UNCONDITIONED
            unconditioned_mark(t);
#else
            mark(t, vread[t]);
#endif
            goto ack
          }
       od;

ack:
       /* settle: the ack is last, by the newest delivery here only; Pub/Sub takes only the
        * latest, unexpired ack id */
       do
       SLOW(t)
       :: atomic {
            ack_after_durable(final_since[tm[t]]);
            if
            :: !NEWEST(t) -> printf("@ t%d: leaves the ack to the newer delivery\n", t)
            :: NEWEST(t) && valid[tm[t]] == t ->
                acked[tm[t]] = 1;
                valid[tm[t]] = NOBODY;
                printf("@ t%d: acks message %d\n", t, tm[t])
            :: NEWEST(t) && FAULT && valid[tm[t]] == t ->
                nf++;
                valid[tm[t]] = NOBODY;
                printf("@ t%d: its ack is lost\n", t)
            :: NEWEST(t) && valid[tm[t]] != t ->
                printf("@ t%d: its ack is refused (stale ack id)\n", t)
            fi;
            goto done
          }
       od;

giveback:
       /* NACK, DEFER or DROP: nothing written; the message comes back */
       atomic {
           printf("@ t%d: gives message %d back\n", t, tm[t]);
           if
           :: valid[tm[t]] == t -> valid[tm[t]] = NOBODY
           :: else -> nothing
           fi;
           goto done
       };

done:
       /* the delivery ends (a crash did the rest: its claim is left to lapse) */
       atomic {
           if
           :: latest[PROC(t) * NMSG + tm[t]] == t -> latest[PROC(t) * NMSG + tm[t]] = NOBODY
           :: else -> nothing
           fi;
           ended(t)
       }
    od
}

/* ---------------------------------------------------------- the operator */

/* `jobs show`, then `jobs release --expect-epoch` with the epoch shown; `jobs replay` of a
 * failed job: reset (new epoch, attempts 0), then publish; and one foreign write that moves
 * the version without changing the owner: no function of the library, any write that
 * changes no owner (an edit by hand in the Firestore console, an admin script). */
proctype Operator() {
end_operator:
    do
    :: atomic {
        phase == 0 && !published[1] && st == RUNNING ->
        phase = 1;
        op_epc = 1;
        op_claimed = 0;
        printf("@ operator: jobs show\n")
       }
    :: atomic {
        phase == 1 ->
        phase = 2;
        if
        :: FINAL || !op_epc || st == RELEASED -> printf("@ operator: jobs release is refused\n")
        :: else ->
            printf("@ operator: jobs release --expect-epoch\n");
            release_aimed(!op_claimed);
            st = RELEASED;
            live = 0;
            unclaimed();
            lastw = OLD;
            moved();
            bump_epoch()
        fi;
        op_epc = 0;
        op_claimed = 0
       }
    :: atomic {
        st == FAILED && !published[1] && phase == 0 ->
        printf("@ operator: jobs replay\n");
        st = RELEASED;
        datt = 0;
        lastw = OLD;
        moved();
        bump_epoch();
        published[1] = 1;
        final_since[1] = 0;
        rvp = 0;
        reviewed = 0
       }
    :: atomic {
        FAULT && !fw && st != ABSENT ->
        printf("@ operator: a foreign write changes the job, not its owner\n");
        fw = 1;
        nf++;
        lastw = OLD;
        moved()
       }
    od
}

init {
    atomic {
        published[0] = 1;
        run Thread(0);
        run Thread(1);
        run Thread(2);
        run Operator()
    }
}

/* ------------------------------------------------------------ liveness */

/* Every run has at most MAXF faults, so its faults phase ends: then the job ends completed,
 * or failed with the failure message of its current era published and its record marked so,
 * and every message is acked. */
#define ALL_ACKED (acked[0] && (!published[1] || acked[1]))

ltl settles { <> [] (FINAL && ALL_ACKED && !rvp && (st == COMPLETED || reviewed)) }
