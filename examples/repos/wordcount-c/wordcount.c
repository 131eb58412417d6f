/* wordcount: counts lines, words and bytes of standard input, like `wc`. */
#include <ctype.h>
#include <stdio.h>

struct counts {
  long lines, words, bytes;
};

struct counts count_stream(FILE* in) {
  struct counts c = {0, 0, 0};
  int ch;
  int in_word = 0;
  while ((ch = getc(in)) != EOF) {
    c.bytes++;
    if (ch == '\n') c.lines++;
    if (ch == ' ') {
      in_word = 0;
    } else if (!in_word) {
      in_word = 1;
      c.words++;
    }
  }
  return c;
}

int main(void) {
  struct counts c = count_stream(stdin);
  printf("%ld %ld %ld\n", c.lines, c.words, c.bytes);
  return 0;
}
