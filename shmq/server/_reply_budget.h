/* GENERATED from shmq/server/handlers/answers.py: do not edit. Regenerate with
 * python -c 'from shmq.server.handlers import answers; answers.write_c_header()' */
#ifndef SHMQ_REPLY_BUDGET_H
#define SHMQ_REPLY_BUDGET_H

#define RECORD_OVERHEAD 128
#define REPLY_RESERVE 1024

#endif
