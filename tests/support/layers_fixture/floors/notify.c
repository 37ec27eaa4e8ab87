#define TWICE(x) ((x) * 2)
int notify_changed(int x) { return TWICE(x); }
