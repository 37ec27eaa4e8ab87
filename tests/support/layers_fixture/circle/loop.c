/* A file at the top of the fixture: it calls table.c, which reaches back here
 * through notify.c (loop -> table -> notify -> loop). */
int table_put(int);
int loop_wake(int x) { return x + 1; }
int loop_run(int x) { return table_put(x); }
