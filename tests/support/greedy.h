/* Small pieces the forward tests share: the greedy pick and prompts of
 * seeded ids. */
#ifndef TESTS_GREEDY_H
#define TESTS_GREEDY_H

/* The index of the largest of x[0..n) (the first of equal ones). */
int argmax(const float *x, int n);

/* n ids in [1, vocab) from a seed; the same seed gives the same ids, so
 * prompts of one seed share their prefix. */
void seeded_prompt(int *p, int n, unsigned seed, int vocab);

#endif
