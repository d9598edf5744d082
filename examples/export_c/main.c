/* Train micrograd's moons MLP in C with the step burjit exported (export.py): no Python at run time.
 *
 * moons.h (from burjit.export) documents the step's ABI: argv holds the inputs (the parameters,
 * x, y, the learning rate), the outputs (the new parameters, written into the donated parameter
 * inputs, then the loss and the accuracy) and the arena, which the caller owns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moons.h"
#include "moons_data.h"

int main(void) {
    void *argv[MOONS_N_INPUTS + MOONS_N_OUTPUTS + 1];
    double lr, loss, accuracy;
    size_t arena_bytes = (MOONS_ARENA_BYTES + MOONS_ARENA_ALIGN - 1) / MOONS_ARENA_ALIGN * MOONS_ARENA_ALIGN;
    void *arena = aligned_alloc(MOONS_ARENA_ALIGN, arena_bytes ? arena_bytes : MOONS_ARENA_ALIGN);
    if (arena == NULL) return 2;
    memset(arena, 0, arena_bytes);  /* zero-filled before the first call, as moons.h asks */

    for (int k = 0; k < LR_INPUT; k++) argv[k] = INPUTS[k];
    argv[LR_INPUT] = &lr;
    for (int j = 0; j < N_PARAM_LEAVES; j++) argv[MOONS_N_INPUTS + j] = INPUTS[j];  /* written into the inputs */
    argv[MOONS_N_INPUTS + N_PARAM_LEAVES] = &loss;
    argv[MOONS_N_INPUTS + N_PARAM_LEAVES + 1] = &accuracy;
    argv[MOONS_N_INPUTS + MOONS_N_OUTPUTS] = arena;

    for (int k = 0; k < STEPS; k++) {
        lr = 1.0 - 0.9 * k / STEPS;  /* as export.py's learning_rate: the same bits */
        int rc = moons_step(argv);
        if (rc != 0) {
            fprintf(stderr, "moons_step failed with error %d (see moons.h)\n", rc);
            return 1;
        }
        printf("step %d loss %.17g accuracy %.17g\n", k, loss, accuracy);
    }
    free(arena);
    return 0;
}
