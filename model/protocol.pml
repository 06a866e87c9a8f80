/*
 * pubsub-worker's exactly-once processing protocol, for SPIN.
 *
 * One job (one key); its original message and the copy `jobs replay`
 * publishes; two callback threads, each in its own worker process; the job
 * document; Pub/Sub with exactly-once delivery; the operator's `jobs show`,
 * `jobs release --expect-epoch` and `jobs replay`. docs/protocol.md maps
 * every action to the function that implements it, says what is abstracted
 * and why, and states each property. `python model/check.py` checks them;
 * with --mutants it also refutes the named mutants below.
 *
 * Mutants (spin -DMUTANT_X):
 *   MUTANT_COMMIT_UNCONDITIONED     the owner's writes land without the version condition
 *   MUTANT_ACK_BEFORE_DURABLE       the ack is sent before the completion is written
 *   MUTANT_CLAIM_NO_EPOCH_BUMP      a claim keeps the epoch it read
 *   MUTANT_RENEW_WITHOUT_OWNERSHIP  the lease renewal writes without the ownership checks
 *   MUTANT_COMPLETE_WITH_UNSENT     the completion does not publish unsent entries first
 *   MUTANT_REVIEW_BEFORE_RECORD     the failure message is published before the failed record
 *                                   is written (the order of releases up to 0.9)
 *
 * Safety properties are assertions, each enabled by -DCHECK_<NAME> (or all
 * by -DCHECK_ALL); the liveness property is the ltl formula at the end.
 * Lines starting with "@" in a replayed trail are this model's narration.
 */

/* ---------------------------------------------------------------- sizes */

#define NT      2               /* callback threads; thread t runs in process t */
#define NMSG    2               /* message 0: the original; 1: the copy a replay publishes */
#define MAXATT  2               /* MAX_ATTEMPTS */
#define SATATT  (MAXATT + 2)    /* attempts saturate here: every value above MAXATT decides alike */
#ifndef MAXF
#define MAXF    2               /* faults in one run, at most */
#endif

#define NOBODY  255             /* no thread, process or message */
#define OLD     254             /* a writer no live delivery is any more */
#define OPW     253             /* the operator, as the last writer */

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

/* ----------------------------------------------------------- properties */

#ifdef CHECK_ALL
#define CHECK_ONE_COMPLETION 1
#define CHECK_FENCED 1
#define CHECK_STEPS 1
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
#define ack_after_durable(c)     assert(!CHECK_ACK_AFTER_DURABLE || (c))
#define outbox(c)                assert(!CHECK_OUTBOX || (c))
#define failed_xor_completed(c)  assert(!CHECK_FAILED_XOR_COMPLETED || (c))
#define release_aimed(c)         assert(!CHECK_RELEASE_AIMED || (c))
#define review_only_failed(c)    assert(!CHECK_REVIEW_ONLY_FAILED || (c))

/* ------------------------------------------------- the job document */

byte st = ABSENT;               /* status */
byte dthr = NOBODY;             /* `delivery` of the running claim: the thread holding it; NOBODY: none */
byte downer = NOBODY;           /* `owner` of the running claim: its process */
byte dmsg = NOBODY;             /* `message_id` of the running claim */
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

byte latest[NT * NMSG] = NOBODY;    /* latest[p * NMSG + m]: the thread of p's latest delivery of m */

/* ------------------------------------------------------------ each thread */

byte tm[NT] = NOBODY;           /* the message of its delivery; NOBODY: idle */
bit  epc[NT];                   /* its epoch is the document's */
byte stg[NT];                   /* staged for its next write: S0, SENT */
byte known[NT];                 /* steps it knows recorded (its claim's read, and its own) */
bit  unsent[NT];                /* S1's entry is in its outbox, not published by it yet */
byte att[NT];                   /* its attempt: the attempts its claim wrote */
bit  stop[NT];                  /* stop_error: LostOwnership */
bit  lost[NT];                  /* its delivery is known lost (a renewal refused, a stall given up) */
bit  rera[NT];                  /* the era (replays so far) in which it saw the job failed */

/* ---------------------------------------------- faults, operator, ghosts */

byte nf;                        /* faults so far */
bit  op_epc;                    /* the epoch `jobs show` showed is still the document's */
bit  op_claimed;                /* ghost: a claim landed since that `jobs show` */
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

/* ---------------------------------------------------------- predicates */

#define FAULT     (nf < MAXF)
#define FINAL     (st == COMPLETED || st == FAILED)
#define RECV(m)   (published[m] && !acked[m] && valid[m] == NOBODY)
#define CUR(t)    (!lost[t] && latest[(t) * NMSG + tm[t]] == (t))       /* tracker.is_current */
#define CHECK(t)  (!stop[t] && CUR(t))                                  /* JobOwnership._check_owner */
#define OURS(t)   (epc[t] && dthr == (t) && st == RUNNING)              /* FencedDocument.read_own */
/* claim.decide's ours_superseded: the lease is held by an older delivery of this message here */
#define SUPERSEDED(t) (downer == (t) && dmsg == tm[t] && dthr != (t))
#define BUSY(t)   (st == RUNNING && live && !SUPERSEDED(t))                /* ClaimKind.BUSY */

/* ------------------------------------------------------------- writes */

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
    dthr = NOBODY;
    downer = NOBODY;
    dmsg = NOBODY
}

/* A write of thread t lands: its staged records ride along, and it renews the lease of
 * the claim's holder (with no live holder, that lease runs out at once, as when one ends). */
inline land(t) {
    fenced(OURS(t));
    lastw = t;
    live = (dthr != NOBODY);
    if
    :: stg[t] & S0 -> steps(!(rec & S0)); rec = rec | S0
    :: else
    fi;
    if
    :: stg[t] & SENT -> outbox(pubs); obs = 1
    :: else
    fi;
    stg[t] = 0
}

/* FencedDocument.write: conditioned on our version; a conflict is settled by reading. */
inline fwrite(t) {
#ifdef MUTANT_COMMIT_UNCONDITIONED
    ok = 1;
#else
    if
    :: lastw == t || OURS(t) -> ok = 1      /* our version; or a conflict, settled: still ours */
    :: else -> ok = 0; stop[t] = 1          /* LostOwnership */
    fi;
#endif
    if
    :: ok -> land(t)
    :: else -> printf("@ t%d: its write is refused: the job is not its own any more\n", t)
    fi
}

/* JobOwnership.keep_alive (or record_step's write once a third of the lease passed). */
inline renew(t) {
#ifdef MUTANT_RENEW_WITHOUT_OWNERSHIP
    printf("@ t%d: renews the lease (unconditionally)\n", t);
    land(t)
#else
    if
    :: CHECK(t) -> printf("@ t%d: renews the lease\n", t); fwrite(t); ok = 0
    :: else
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
    :: else -> datt = (datt < SATATT -> datt + 1 : SATATT)
    fi;
    st = RUNNING;
    dthr = t;
    downer = t;
    dmsg = tm[t];
    live = 1;
    lastw = t;
#ifndef MUTANT_CLAIM_NO_EPOCH_BUMP
    bump_epoch();
#endif
    op_claimed = 1;
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
    :: else
    fi;
    epc[t] = 0;
    stg[t] = 0;
    known[t] = 0;
    unsent[t] = 0;
    att[t] = 0;
    stop[t] = 0;
    lost[t] = 0;
    rera[t] = 0;
    tm[t] = NOBODY
}

/* A failure message goes out (FailurePath): it describes a failure of the job's current era
 * only while the job is failed; one of an earlier era (a late duplicate, after a replay
 * revived the job) describes the failure the operator replayed. */
inline review_out(t) {
    review_only_failed(st == FAILED || rera[t] != published[1]);
    if
    :: rera[t] == published[1] -> reviewed = 1
    :: else
    fi
}

/* The faults that may strike a busy thread before its next step, within the budget:
 * it was slow and its ack deadline lapsed; it was slow and its claim's lease lapsed;
 * its process crashed. */
#define SLOW(t) \
    :: atomic { FAULT && valid[tm[t]] == t -> nf++; valid[tm[t]] = NOBODY; \
        printf("@ t%d: is slow: its ack deadline lapses\n", t) } \
    :: atomic { FAULT && dthr == t && st == RUNNING && live -> nf++; live = 0; \
        printf("@ t%d: is slow: its lease lapses\n", t) } \
    :: atomic { FAULT -> nf++; printf("@ t%d: its process crashes\n", t); goto crashed }

/* ---------------------------------------------------- a callback thread */

proctype Thread(byte t) {
end_idle:
    do
    :: atomic {
        RECV(0) || RECV(1) ->
        if
        :: RECV(0) -> tm[t] = 0
        :: RECV(1) -> tm[t] = 1
        fi;
        valid[tm[t]] = t;
        latest[t * NMSG + tm[t]] = t;
        printf("@ t%d: receives message %d\n", t, tm[t])
       };

       /* the claim (claiming.claim_job, claim.claim): another owner's live lease is
        * waited for (polled, then deferred until it runs out), unless the delivery lapsed */
       do
       SLOW(t)
       :: atomic {
            (!BUSY(t) || valid[tm[t]] != t || lost[t]) ->
            learn(t);
            if
            :: !CUR(t) -> goto giveback                                 /* DROP */
            :: else
            fi;
            if
            :: st == FAILED && rvp ->                                   /* publish_pending */
                printf("@ t%d: finds the job failed, its failure message pending\n", t);
                rera[t] = published[1];
                goto pending
            :: FINAL && !(st == FAILED && rvp) ->
                printf("@ t%d: finds the job done\n", t); goto ack              /* ACK */
            :: BUSY(t) -> printf("@ t%d: finds the job busy\n", t); goto giveback  /* DEFER */
            :: else -> claim(t); break
            fi
          }
       od;

       /* earlier owners' unsent entries go out first; then: attempts left? (flow._start)
        * (no step may start with an `if` holding an `else`: SPIN would make that `else`
        * compete with the faults of SLOW, taking it only when no fault can strike) */
       do
       SLOW(t)
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
                :: else
                fi
            :: else
            fi;
            if
            :: att[t] > MAXATT -> goto review                           /* REVIEW */
            :: else -> break
            fi
          }
       od;
       if
       :: atomic { renew(t) }
       :: skip
       fi;

       /* step S0 (JobCore.run_step): the function runs, its record is staged */
       do
       SLOW(t)
       :: atomic {
            learn(t);
            if
            :: !CHECK(t) -> stop[t] = 1; goto giveback                  /* LostOwnership */
            :: else
            fi;
            if
            :: known[t] & S0 -> printf("@ t%d: skips S0 (recorded)\n", t)
            :: else ->
                steps(!(OURS(t) && (rec & S0)));
                stg[t] = stg[t] | S0;
                known[t] = known[t] | S0;
                printf("@ t%d: runs S0; its record is staged\n", t)
            fi;
            break
          }
       od;
       if
       :: stg[t] & S0 -> atomic { renew(t) }
       :: skip
       fi;

       /* step S1: the previous step's record is durable before it runs (open_step) */
       do
       SLOW(t)
       :: atomic {
            learn(t);
            if
            :: !CHECK(t) -> stop[t] = 1; goto giveback
            :: else
            fi;
            if
            :: known[t] & S1 -> printf("@ t%d: skips S1 (recorded)\n", t); goto returned
            :: else
            fi;
            if
            :: stg[t] & S0 ->
                printf("@ t%d: writes S0's record\n", t);
                fwrite(t);
                if
                :: !ok -> goto giveback
                :: else -> ok = 0
                fi
            :: else
            fi;
            break
          }
       od;

       /* S1's function runs (or raises); its record and outbox entry are written at once */
       do
       SLOW(t)
       :: atomic {
            steps(rec & S0);
            steps(!(OURS(t) && (rec & S1)));
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
                steps(!(rec & S1));
                rec = rec | S1;
                obc = 1;
                stg[t] = 0;
                known[t] = known[t] | S1;
                unsent[t] = 1
            :: else -> goto giveback
            fi;
            break
          }
       od;

       /* after the commit, the entry is published if it can be (_try_publish_unsent) */
       do
       SLOW(t)
       :: atomic {
            learn(t);
            if
            :: !CHECK(t) -> stop[t] = 1; goto giveback
            :: else -> publish(t); break
            fi
          }
       od;

returned:
       /* the handler returns: COMPLETE (JobCore.complete); or it raises after its steps */
       do
       SLOW(t)
       :: atomic {
            learn(t);
            if
            :: true
            :: printf("@ t%d: the handler raises after its steps\n", t); goto handler_error
            fi;
            if
            :: !CHECK(t) -> stop[t] = 1; goto giveback                  /* the stop decides */
            :: else
            fi;
#ifndef MUTANT_COMPLETE_WITH_UNSENT
            if
            :: unsent[t] ->
                publish(t);
                if
                :: unsent[t] -> goto release_nocount                    /* OutboxUnsent: RELEASE */
                :: else
                fi
            :: else
            fi;
#endif
            break
          }
       od;
#ifdef MUTANT_ACK_BEFORE_DURABLE
       do
       SLOW(t)
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
       SLOW(t)
       :: atomic {
            printf("@ t%d: writes the completion\n", t);
            fwrite(t);
            if
            :: ok ->
                ok = 0;
                one_completion(ncomplete == 0);
                review_only_failed(!reviewed);
                failed_xor_completed(st == RUNNING);
                outbox(!obc || obs);
                st = COMPLETED;
                live = 0;
                unclaimed();
                ncomplete++;
                final_since[0] = 1;
                final_since[1] = 1
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
       SLOW(t)
       :: atomic {
            learn(t);
            if
            :: stop[t] || !CUR(t) -> goto giveback
            :: else
            fi;
            if
            :: att[t] >= MAXATT -> goto review
            :: else ->
                printf("@ t%d: releases the job (the attempt counted)\n", t);
                fwrite(t);
                if
                :: ok -> ok = 0; st = RELEASED; live = 0; unclaimed(); datt = att[t]
                :: else
                fi;
                goto giveback
            fi
          }
       od;

handler_permanent:
       /* PermanentError: REVIEW at once; stopped or stale: no write */
       do
       SLOW(t)
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
       SLOW(t)
       :: atomic {
            printf("@ t%d: releases the job (the attempt given back)\n", t);
            fwrite(t);
            if
            :: ok -> ok = 0; st = RELEASED; live = 0; unclaimed(); datt = att[t] - 1
            :: else
            fi;
            goto giveback
          }
       od;

review:
       /* the failure path (FailurePath.send): a fenced write first, a stale owner stops here */
       do
       SLOW(t)
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
           SLOW(t)
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
               SLOW(t)
               :: atomic {
                    fwrite(t);
                    if
                    :: ok -> ok = 0; break
                    :: else -> goto giveback
                    fi
                  }
               od
           :: else
           fi
       :: else
       fi;
#ifdef MUTANT_REVIEW_BEFORE_RECORD
       do
       SLOW(t)
       :: atomic { FAULT -> nf++; printf("@ t%d: the failure message's publish fails\n", t);
                   goto giveback }
       :: atomic { printf("@ t%d: publishes the failure message\n", t);
                   rera[t] = published[1]; review_out(t); break }
       od;
#endif
       /* the failed record, fenced; `review: pending` */
       do
       SLOW(t)
       :: atomic {
            printf("@ t%d: writes the failed record (review pending)\n", t);
            fwrite(t);
            if
            :: ok ->
                ok = 0;
                failed_xor_completed(st == RUNNING);
                st = FAILED;
                rvp = 1;
                live = 0;
                unclaimed();
                final_since[0] = 1;
                final_since[1] = 1;
                rera[t] = published[1];
                break
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
            if
            :: lastw == t -> rvp = 0; printf("@ t%d: marks the review sent\n", t)
            :: else -> printf("@ t%d: its mark is refused (written since)\n", t)
            fi;
            goto ack
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
            /* conditioned on the version it read: only a mark or a replay wrote a failed job */
            if
            :: st == FAILED && rera[t] == published[1] ->
                rvp = 0; lastw = OLD; printf("@ t%d: marks the review sent\n", t)
            :: else -> printf("@ t%d: its mark is refused (replayed since)\n", t)
            fi;
            goto ack
          }
       od;

ack:
       /* settle: the ack is last; Pub/Sub takes only the latest, unexpired ack id */
       do
       SLOW(t)
       :: atomic {
            ack_after_durable(final_since[tm[t]]);
            if
            :: valid[tm[t]] == t ->
                acked[tm[t]] = 1;
                valid[tm[t]] = NOBODY;
                printf("@ t%d: acks message %d\n", t, tm[t])
            :: FAULT && valid[tm[t]] == t ->
                nf++;
                valid[tm[t]] = NOBODY;
                printf("@ t%d: its ack is lost\n", t)
            :: valid[tm[t]] != t -> printf("@ t%d: its ack is refused (stale ack id)\n", t)
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
           :: else
           fi;
           goto done
       };

crashed:
       atomic {
           if
           :: valid[tm[t]] == t -> valid[tm[t]] = NOBODY
           :: else
           fi;
           latest[t * NMSG] = NOBODY;
           latest[t * NMSG + 1] = NOBODY
           /* falls through: its claim is left to lapse */
       };

done:
       atomic {
           if
           :: latest[t * NMSG + tm[t]] == t -> latest[t * NMSG + tm[t]] = NOBODY
           :: else
           fi;
           /* a claim whose delivery is gone: nobody renews it, its lease runs out */
           if
           :: dthr == t -> live = 0; unclaimed()
           :: else
           fi;
           forget(t)
       }
    od
}

/* ---------------------------------------------------------- the operator */

/* `jobs show`, then `jobs release --expect-epoch` with the epoch shown; and
 * `jobs replay` of a failed job: reset (new epoch, attempts 0), then publish. */
proctype Operator() {
    byte phase;     /* 0: nothing yet; 1: shown; 2: released (or refused) */
end_operator:
    do
    :: atomic {
        phase == 0 && st == RUNNING ->
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
            lastw = OPW;
            bump_epoch()
        fi
       }
    :: atomic {
        st == FAILED && !published[1] ->
        printf("@ operator: jobs replay\n");
        st = RELEASED;
        datt = 0;
        lastw = OPW;
        bump_epoch();
        published[1] = 1;
        final_since[1] = 0;
        rvp = 0;
        reviewed = 0
       }
    od
}

init {
    atomic {
        published[0] = 1;
        run Thread(0);
        run Thread(1);
        run Operator()
    }
}

/* ------------------------------------------------------------ liveness */

/* Every run has at most MAXF faults, so its faults phase ends: then, under weak fairness,
 * the job ends completed or failed (a failed one with its failure message out) and every
 * message is acked. */
#define ALL_ACKED (acked[0] && (!published[1] || acked[1]))

ltl settles { <> [] (FINAL && ALL_ACKED && !rvp) }
