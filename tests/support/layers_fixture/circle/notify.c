int loop_wake(int);
int notify_changed(int x) { return loop_wake(x); }
